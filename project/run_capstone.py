"""Capstone: DDP + ZeRO-1 + sharded checkpoints, built by you, training GPT-2 on 4 ranks, with an exact resume.

    python project/run_capstone.py                       # 4 ranks (gloo on CPU, NCCL on 4 GPUs), 20 steps
    python project/run_capstone.py --resume DIR          # continue from a checkpoint folder to --steps

Each rank trains the tiny GPT-2 on its rows of every global batch with your ``BucketedDDP`` (4.1) and
``ShardedOptimizer(Adam)`` (4.2), and writes a sharded checkpoint at ``--save_step`` with ``save_sharded`` (4.3).
Then new processes load that checkpoint with ``load_sharded`` and train to the end again; ``RESUME VERIFIED`` is
printed when their losses and final parameters equal the straight run's bit for bit. Exit codes: 0 every invariant
holds, 1 one failed (the message says which: loss not decreasing, parameters that differ across ranks, optimizer
memory off 12P/N, resume mismatch), 2 bad arguments or a Problem 4 region not written yet (one line, before any rank
starts). It writes ``straight/``, ``resumed/`` and the checkpoint to ``<workdir>/out/capstone/<run>/``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python project/run_capstone.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from common.startup import GPT2_IMPORTS
from project import readiness
from project.cli import ConfigError, RunFailed, float_above, int_at_least, run_cli
from project.config import RunConfig
from project.manifest import verify
from project.options import add_launch_args, new_parser, out_dir, run_name
from project.output import print_header, quiet_libraries, write_json

if TYPE_CHECKING:
    import torch

    from project.devices import RankEnv

NAME = "capstone"
COMMAND = "project/run_capstone.py"
LOSS_NOISE = 0.05        # the last steps' mean loss must be below the first steps' by more than this


class InvariantError(RunFailed):
    """A capstone invariant failed; the message says which. Exit code 1."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of this entry point (numbers range-checked while parsing)."""
    parser = new_parser(COMMAND, __doc__)
    add_launch_args(parser, 4, "ranks to start")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    parser.add_argument("--save_step", type=int, default=10, help="checkpoint after this many steps")
    parser.add_argument("--batch_size", type=int, default=16, help="global batch (sequences), split over the ranks")
    parser.add_argument("--max_len", type=int_at_least(4), default=48, help="tokens per sequence at most")
    parser.add_argument("--lr", type=float_above(0.0), default=3e-3, help="Adam learning rate")
    parser.add_argument("--bucket_mb", type=float_above(0.0), default=1.0, help="BucketedDDP bucket cap in MiB")
    parser.add_argument("--preset", default="tiny", help="model preset of project/model.py")
    parser.add_argument("--seed", type=int, default=0, help="corpus, model and RNG seed")
    parser.add_argument("--workdir", default="workdir",
                        help="cache for data and tokenizer; runs write under <workdir>/out/")
    parser.add_argument("--out_dir", default=None,
                        help="run folder; None: <workdir>/out/capstone/<run name> (one per configuration)")
    parser.add_argument("--resume", default=None, metavar="DIR",
                        help="continue from this checkpoint folder; None: the straight run, then its resume")
    return parser


def check_args(args: argparse.Namespace) -> None:
    """Raise ConfigError for sizes that cannot run."""
    if args.steps < 2 or not 1 <= args.save_step < args.steps:
        raise ConfigError(f"need --steps >= 2 and 1 <= --save_step < --steps, got {args.steps} and {args.save_step}")
    if args.batch_size < args.world_size or args.batch_size % args.world_size:
        raise ConfigError(f"--batch_size {args.batch_size} must be a positive multiple of --world_size "
                          f"{args.world_size}")
    if args.resume and not (Path(args.resume) / "manifest.json").is_file():
        raise ConfigError(f"--resume {args.resume}: no manifest.json there (not a save_sharded checkpoint)")
    problem = verify(Path(args.resume)) if args.resume else None   # sizes and sha256 before any rank loads
    if problem:
        raise ConfigError(f"--resume {args.resume}: the checkpoint is damaged: {problem}")
    saved = _saved_world_size(Path(args.resume)) if args.resume else None
    if saved is not None and saved != args.world_size:
        raise ConfigError(f"cannot resume: checkpoint {Path(args.resume).resolve().name} was written by world size "
                          f"{saved}, this run has {args.world_size} (resume with --world_size {saved})")


def _saved_world_size(folder: Path) -> int | None:
    """The world size a save_sharded checkpoint's manifest records, or None when it records none readable (then
    ``load_sharded`` judges the manifest in the ranks)."""
    try:
        saved = json.loads((folder / "manifest.json").read_text()).get("world_size")
    except (OSError, ValueError, AttributeError):
        return None
    return saved if type(saved) is int else None


def _data(args: argparse.Namespace) -> tuple:
    """(training examples, collate, tokenizer): ``steps * batch_size`` pairs, global batch k = pairs [kB, (k+1)B)."""
    from project.data import make_collate, prepare_data

    pairs, _, tokenizer = prepare_data("embedded", "bpe", Path(args.workdir), args.steps * args.batch_size, 16,
                                       args.seed)
    return pairs, make_collate(tokenizer, args.max_len), tokenizer


def _rows(args: argparse.Namespace | RunConfig, pairs: list, collate, position: int, rank: int, world_size: int):
    """This rank's contiguous rows of global batch ``position``."""
    share = args.batch_size // world_size
    start = position * args.batch_size + rank * share
    return collate(pairs[start:start + share])


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_profile(model: torch.nn.Module, optimizer) -> dict:
    """Bytes this rank holds: parameters, gradients, optimizer state (fp32 master shard + Adam moments)."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"parameters": _tensor_bytes(p for p in model.parameters()),
            "gradients": _tensor_bytes(p.grad for p in model.parameters() if p.grad is not None),
            "optimizer_state": optimizer.state_bytes(), "P": numel,
            "formula_12P_over_N": 12 * math.ceil(numel / optimizer.world_size)}


def params_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes, in order (equal digests: bitwise-equal parameters)."""
    import torch

    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ShardedCheckpoint:
    """The loop's checkpoint store here: your ``save_sharded``/``load_sharded`` (4.3), written once, at ``step``.

    The run's own state (data position, RNG states, loss history) travels in
    ``extra``. ``directory`` None: nothing is saved. No rollback target is
    ever offered (the capstone's guard only refuses non-finite losses).
    """

    def __init__(self, directory: str | None, step: int, model: torch.nn.Module, optimizer):
        self.directory, self.step, self.model, self.optimizer = directory, step, model, optimizer

    def save(self, step: int, state: dict, rank_state: dict, meta: dict) -> None:
        """``save_sharded`` at ``self.step`` (every rank); other steps are not saved."""
        from data_parallel.checkpoint import save_sharded
        from project.checkpoint import failure_is_one_line

        if self.directory is not None and step == self.step:
            with failure_is_one_line(Path(self.directory), step):   # a full disk: one line, not a traceback
                save_sharded(self.directory, step, self.model, self.optimizer,
                             extra={"run": state, "rank": rank_state})

    def load(self, folder: Path) -> tuple[dict, dict]:
        """``load_sharded`` into the model and optimizer; the run's ``(state, rank_state)`` from ``extra``."""
        from data_parallel.checkpoint import load_sharded

        _, extra = load_sharded(folder, self.model, self.optimizer)
        return extra["run"], extra["rank"]

    def saved_steps(self) -> list[int]:
        """None to roll back to."""
        return []

    def folder(self, step: int) -> Path:
        """The checkpoint folder."""
        return Path(self.directory)


def train_rank(env: RankEnv, config: RunConfig, data: tuple, run_dir: Path, load: str | None,
               checkpoint: str | None) -> None:
    """One rank, top to bottom: group, data, model wrapped in your ``BucketedDDP``, your ``ShardedOptimizer``,
    the training loop (fresh, saving at ``save_step`` into ``checkpoint``, or resumed from ``load``), outputs."""
    import torch
    import torch.distributed as dist

    from data_parallel.ddp import BucketedDDP
    from data_parallel.zero1 import ShardedOptimizer
    from project.devices import all_reduce_sum, join_group
    from project.loop import LoopParts, LoopSpec, train
    from project.model import build_model, lm_loss

    quiet_libraries()
    _, device = join_group(env, config.backend, student_setup=False)   # process group
    rank, world_size = env.rank, env.world_size
    train_set, collate, tokenizer = data                                                # data (main prepared it)
    batches = [_rows(config, train_set, collate, position, rank, world_size) for position in range(config.steps)]
    torch.manual_seed(config.seed + rank + (1000 if load else 0))   # a resumed rank must get its RNG back
    model = build_model(config.preset, tokenizer, seed=config.seed + (7 if load else 0)).to(device)   # model
    ddp = BucketedDDP(model, bucket_mb=config.bucket_mb)                               # your BucketedDDP (4.1)
    optimizer = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=config.lr)   # your ZeRO-1 (4.2)
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=None, loader=batches, device=device,
                      loss_of=lambda batch, epoch, index: lm_loss(ddp(batch["input_ids"].to(device)),
                                                                  batch["labels"].to(device)),
                      reduce_grads=ddp.finish_gradient_synchronization, rank=rank, world_size=world_size,
                      all_reduce_sum=all_reduce_sum, barrier=dist.barrier,
                      checkpoints=ShardedCheckpoint(checkpoint, config.save_step, model, optimizer))   # 4.3
    result = train(parts, LoopSpec(n_epochs=1, save_every=0 if load else config.save_step, spike_factor=0.0,
                                   resume=Path(load) if load else None))                # the training loop
    losses = result["losses"]                                                           # outputs
    norm = torch.sqrt(sum((p.detach().double() ** 2).sum() for p in model.parameters())).item()
    write_json(run_dir / f"rank{rank}.json",
               {"rank": rank, "start": result["steps"] - len(losses), "losses": losses, "param_norm": norm,
                "params_sha256": params_digest(model), "memory": memory_profile(model, optimizer),
                "backend": config.backend})
    dist.barrier()
    dist.destroy_process_group()


def _run(config: RunConfig, data: tuple, run_dir: Path, load: str | None, checkpoint: Path | None) -> list[dict]:
    """Start the ranks (fresh processes) for one phase; return each rank's results."""
    from project.resume import save_errors_in_one_line
    from project.launch import launch

    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("rank*.json"):
        old.unlink()
    with save_errors_in_one_line():
        launch(train_rank, config.world_size, run_dir,
               (config, data, run_dir, load, str(checkpoint) if checkpoint else None), GPT2_IMPORTS, config.timeout)
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(config.world_size)]


def print_losses(results: list[dict], label: str) -> None:
    """The loss table: one row per step (mean over ranks of the local losses)."""
    first = results[0]
    print(f"{label}\n  step  loss (mean over {len(results)} ranks)")
    for k, loss in enumerate(first["losses"]):
        print(f"  {first['start'] + k + 1:4d}  {loss:.4f}")


def print_memory(results: list[dict]) -> None:
    """Per-rank bytes: parameters, gradients, optimizer state, next to ZeRO-1's 12P/N."""
    print("per-rank memory (bytes)\n  rank  parameters  gradients  optimizer state  12P/N formula")
    for r in results:
        m = r["memory"]
        print(f"  {r['rank']:4d}  {m['parameters']:10,d}  {m['gradients']:9,d}  {m['optimizer_state']:15,d}  "
              f"{m['formula_12P_over_N']:13,d}")
    m = results[0]["memory"]
    print(f"  (P = {m['P']:,d} parameters; a replicated Adam would hold 12P = {12 * m['P']:,d} bytes per rank)")


def check_invariants(results: list[dict]) -> None:
    """Raise InvariantError unless the loss falls, the ranks agree on the parameters and memory is 12P/N."""
    losses = results[0]["losses"]
    k = max(1, len(losses) // 4)
    head, tail = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if not tail < head - LOSS_NOISE:
        raise InvariantError(f"loss not decreasing: mean of the first {k} steps {head:.4f}, of the last {k} "
                             f"{tail:.4f} (needs a drop of more than {LOSS_NOISE})")
    norms = [r["param_norm"] for r in results]
    if len({r["params_sha256"] for r in results}) != 1:
        raise InvariantError(f"parameters differ across ranks (norms {norms}): the ranks are not in sync")
    for r in results:
        m = r["memory"]
        if m["optimizer_state"] != m["formula_12P_over_N"]:
            raise InvariantError(f"rank {r['rank']} holds {m['optimizer_state']:,d} bytes of optimizer state, "
                                 f"ZeRO-1 gives 12P/N = {m['formula_12P_over_N']:,d}")


def verify_resume(straight: list[dict], resumed: list[dict], save_step: int) -> None:
    """Raise InvariantError unless the resumed ranks' losses and final parameters equal the straight run's."""
    want, got = straight[0]["losses"][save_step:], resumed[0]["losses"]
    if got != want:
        raise InvariantError(f"resume mismatch: losses after step {save_step} were {want}, resumed {got}")
    for a, b in zip(straight, resumed):
        if a["params_sha256"] != b["params_sha256"]:
            raise InvariantError(f"resume mismatch: rank {a['rank']}'s final parameters differ from the straight "
                                 "run's")


def main(argv: list[str] | None = None) -> int:
    """Run the capstone (or ``--resume``); return 0 when every invariant holds.

    Raises ConfigError for bad arguments and unwritten Problem 4 code before any rank starts, InvariantError.
    """
    args = build_parser().parse_args(argv)   # a malformed option exits with code 2 and one line
    readiness.ensure_ready(COMMAND, readiness.CAPSTONE)
    check_args(args)
    from project.devices import resolve_backend   # torch and the library: only after the checks
    from project.launch import start_rank_server

    backend = resolve_backend(args.backend, args.world_size)
    start_rank_server(args.world_size, GPT2_IMPORTS)
    quiet_libraries()
    data = _data(args)                     # once: every rank receives it
    folder = out_dir(args, NAME, run_name(args, build_parser(), {"world_size": f"ws{args.world_size}"}))
    config = RunConfig.of(args, world_size=args.world_size, backend=backend, out_dir=folder,
                          resume=Path(args.resume) if args.resume else None)
    print_header(f"capstone: {args.world_size} ranks, backend {backend}, "
                 f"BucketedDDP(bucket_mb={args.bucket_mb:g}) + ShardedOptimizer(Adam), {args.steps} steps, "
                 + (f"resumed from {args.resume}" if args.resume else f"checkpoint at step {args.save_step}"))
    if config.resume:
        resumed = _run(config, data, folder / "resumed", str(config.resume.resolve()), None)
        print_losses(resumed, f"resumed from {args.resume}")
        print(resume_verdict(config, folder, resumed))
        return 0
    checkpoint = (folder / f"checkpoint_step{args.save_step}").resolve()
    straight = _run(config, data, folder / "straight", None, checkpoint)
    print_losses(straight, "straight run")
    print_memory(straight)
    print(f"checkpoint manifest ({checkpoint / 'manifest.json'}):")
    print(json.dumps(json.loads((checkpoint / "manifest.json").read_text()), indent=1))
    check_invariants(straight)
    resumed = _run(config, data, folder / "resumed", str(checkpoint), None)
    print_losses(resumed, f"resumed from step {args.save_step} in new processes")
    verify_resume(straight, resumed, args.save_step)
    print("RESUME VERIFIED: losses and final parameters of the resumed run equal the straight run's bit for bit")
    print(f"  wrote: {folder} (straight/, resumed/, checkpoint_step{args.save_step}/)")
    return 0


def resume_verdict(args: argparse.Namespace | RunConfig, folder: Path, resumed: list[dict]) -> str:
    """The closing line of ``--resume``: the steps it ran, and whether they match ``folder``'s uninterrupted run
    when ``args.resume`` is that folder's checkpoint (InvariantError when not), else where they were written."""
    start, last = resumed[0]["start"] + 1, resumed[0]["start"] + len(resumed[0]["losses"])
    said = f"resumed at step {start}: steps {start}-{last}"
    own = (folder / f"checkpoint_step{resumed[0]['start']}").resolve() == Path(args.resume).resolve()
    files = [folder / "straight" / f"rank{r}.json" for r in range(args.world_size)]
    if own and all(f.is_file() for f in files):
        verify_resume([json.loads(f.read_text()) for f in files], resumed, resumed[0]["start"])
        return f"{said} match the uninterrupted run in {folder / 'straight'} bit for bit (losses and parameters)"
    return f"{said} written to {folder / 'resumed'} (no uninterrupted run beside {args.resume} to compare with)"


def cli(argv: list[str] | None = None) -> int:
    """``main`` with exit codes: 2 and ``error: ...`` for bad arguments, 1 and ``FAILED: ...`` for an invariant
    (``InvariantError``, a ``project.cli.RunFailed``)."""
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
