"""Problem 1.2 ``setup_process_group``: what the probe records of it, and the judges of ``1.2.setup*``.

Rank side, ``checks.probe_comm`` installs ``recording_init`` as ``dist.init_process_group``, so every call notes
what it was given, and ``record_setup`` runs dry runs of the student's ``setup_process_group``, then joins the
group for real. Parent side, ``check_setup`` and ``check_setup_timeout_default`` judge those parts;
``checks.py`` registers them as the case's first criteria.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import os
from typing import Callable

import torch

from grading.check import CheckFailed, SplitRun, describe, expect
from grading.problems.probe_helpers import call_outcome

PG_TIMEOUT_S = 30        # the process group's collective timeout: a lost peer becomes an error, not a hang
# setup_process_group must pass its arguments on: a backend string other than the default "gloo", a timeout
# other than the default 60 s, and a file:// URL while the environment holds an unusable MASTER_PORT (a group
# that ignores init_method and falls back to env:// fails at once instead of joining).
SETUP_BACKEND = "cpu:gloo"
UNUSABLE_PORT = "unusable-use-the-given-init_method"
DEFAULT_TIMEOUT_S = 60   # the contract's timeout when None is given
ZERO_TIMEOUT = datetime.timedelta(0)    # falsy but given: passed on as it is (`timeout or 60 s` would replace it)
# init_method=None means env://: the MASTER_* values a caller set are kept, unset ones default to these.
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT")
CALLER_ENV = {"MASTER_ADDR": "192.0.2.7", "MASTER_PORT": "12345"}      # never joined: the dry run stops first
DEFAULT_ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
ENV_INIT_METHODS = (None, "env://")
NOT_CALLED = "not called"    # setup_process_group did not reach dist.init_process_group
DRY_RUN_MESSAGE = "the grader stopped init_process_group here to read its arguments (a dry run)"

P_SETUP_DEFAULT = "setup_default_timeout"    # [outcome, timeout given] of a dry run of setup with timeout=None
P_SETUP_ZERO = "setup_zero_timeout"          # [outcome, timeout given] of a dry run with timeout=timedelta(0)
P_SETUP_ENV = "setup_env"    # dry runs of setup with init_method=None: the environment init_process_group saw
P_SETUP = "setup"
P_SETUP_NCCL = "setup_nccl"  # dry runs of setup with backend="nccl": the GPUs selected, before or after joining
# "nccl" as a command line gives it: a string made at run time, equal to the literal but not the same object
RUNTIME_NCCL = "".join(("nc", "cl"))
FAKE_GPU_COUNTS = (1, 3)     # rank % count tells a rank's own GPU from a constant one and from the rank itself
# Only backend == "nccl" selects a GPU: "zgloo", a CPU backend the probe registers (its process group is gloo's),
# sorts after "nccl", so a backend compared by order (`backend >= "nccl"`) would select one.
CPU_BACKEND = "zgloo"
P_SETUP_CPU_BACKEND = "setup_cpu_backend"    # a dry run of setup with backend=CPU_BACKEND while GPUs are reported


class DryRunStop(RuntimeError):
    """Raised by the probe's init_process_group in a dry run; setup_process_group must let it through."""


# ---------------------------------------------------------------- probe (rank side)
def recording_init(real_init: Callable, calls: dict) -> Callable:
    """A stand-in for ``real_init`` (``dist.init_process_group``) that writes into ``calls`` what each call gets.

    It sets ``calls["init_timeout"]`` to the timeout given (None: torch's
    default) and ``calls["init_env"]`` to its init_method and the MASTER_*
    environment it runs in; while ``calls["dry_run"]`` is true it then raises
    ``DryRunStop`` instead of joining, otherwise it calls ``real_init``.
    """
    def init_process_group(*args, **kwargs):
        """init_process_group that notes the timeout it was given (None: torch's default), its init_method and
        the MASTER_* environment it runs in; in a dry run it stops there with DryRunStop instead of joining."""
        given = inspect.signature(real_init).bind(*args, **kwargs).arguments
        calls["init_timeout"] = given.get("timeout")
        calls["init_env"] = {"init_method": _text(given.get("init_method")),
                             **{name: os.environ.get(name) for name in ENV_NAMES}}
        if calls["dry_run"]:
            raise DryRunStop(DRY_RUN_MESSAGE)
        return real_init(*args, **kwargs)
    return init_process_group


def record_setup(ctx, comm, calls: dict, all_reduce: Callable, timeout: datetime.timedelta) -> None:
    """Record the setup parts: the dry runs, then the student's ``setup_process_group`` joining for real.

    ``comm`` is the student's module, imported after ``recording_init`` (sharing
    ``calls``) replaced ``dist.init_process_group``; ``all_reduce`` is the real
    collective; ``timeout`` is the one the real join passes on. Parts:
    ``P_SETUP_DEFAULT`` ([outcome, timeout seen] with ``timeout=None``),
    ``P_SETUP_ZERO`` (the same with ``timeout=ZERO_TIMEOUT``),
    ``P_SETUP_ENV`` (``init_method=None`` with the caller's MASTER_* set, and
    unset), ``P_SETUP_NCCL`` (``backend="nccl"`` while ``torch.cuda`` reports
    each of ``FAKE_GPU_COUNTS`` GPUs: the GPU it selects is noted, none is
    touched), ``P_SETUP_CPU_BACKEND`` (the same with the registered CPU
    backend ``CPU_BACKEND`` and the most GPUs: none may be selected) and
    ``P_SETUP`` (rank, world size, backend, an all_reduce of
    rank + 1 and the timeout seen, once joined through a ``file://`` URL while
    MASTER_PORT is unusable).
    """
    ctx.record(P_SETUP_DEFAULT, lambda: _dry_run_timeout(ctx, comm, calls, None))
    ctx.record(P_SETUP_ZERO, lambda: _dry_run_timeout(ctx, comm, calls, ZERO_TIMEOUT))
    ctx.record(P_SETUP_ENV, lambda: _env_defaults(ctx, comm, calls, timeout))
    ctx.record(P_SETUP_NCCL, lambda: {str(count): _device_dry_run(ctx, comm, calls, timeout, RUNTIME_NCCL, count)
                                      for count in FAKE_GPU_COUNTS})
    ctx.record(P_SETUP_CPU_BACKEND, lambda: _cpu_backend_dry_run(ctx, comm, calls, timeout))
    ctx.record(P_SETUP, lambda: _joined_setup(ctx, comm, calls, all_reduce, timeout))


def _join(ctx, comm, calls: dict, timeout: datetime.timedelta | None, dry_run: bool = False) -> None:
    """The student's setup_process_group through ``file://ctx.store`` while MASTER_PORT is unusable; a
    ``dry_run`` stops inside ``init_process_group`` (DryRunStop), having noted its arguments."""
    calls.update(init_timeout=NOT_CALLED, dry_run=dry_run)
    try:
        with _master_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": UNUSABLE_PORT}):
            comm.setup_process_group(ctx.rank, ctx.world_size, SETUP_BACKEND, init_method=f"file://{ctx.store}",
                                     timeout=timeout)
    finally:
        calls["dry_run"] = False


def _dry_run_timeout(ctx, comm, calls: dict, given: datetime.timedelta | None) -> list:
    """[how a dry run of setup_process_group with ``timeout=given`` ended, the timeout init_process_group saw]."""
    outcome = call_outcome(lambda: _join(ctx, comm, calls, given, dry_run=True))
    return [outcome, _timeout_s(calls["init_timeout"])]


def _env_dry_run(ctx, comm, calls: dict, timeout: datetime.timedelta, env: dict[str, str]) -> dict:
    """A dry run of setup_process_group with init_method=None while MASTER_* hold exactly ``env``: how it
    ended, and the init_method and MASTER_* values that init_process_group saw."""
    calls.update(init_env=NOT_CALLED, dry_run=True)
    try:
        with _master_env(env):
            outcome = call_outcome(lambda: comm.setup_process_group(ctx.rank, ctx.world_size, SETUP_BACKEND,
                                                                    init_method=None, timeout=timeout))
    finally:
        calls["dry_run"] = False
    return {"outcome": outcome, "init": calls["init_env"]}


def _env_defaults(ctx, comm, calls: dict, timeout: datetime.timedelta) -> dict:
    """``_env_dry_run`` with the caller's MASTER_* set (``"set"``), then with them unset (``"unset"``)."""
    return {"set": _env_dry_run(ctx, comm, calls, timeout, CALLER_ENV),
            "unset": _env_dry_run(ctx, comm, calls, timeout, {})}


def _note_gpu(selected: list, calls: dict, device) -> None:
    """``fake_gpus``'s ``set_device``: note ``[index, joined already]`` of the GPU ``device`` selects."""
    selected.append([_index(device), calls["init_timeout"] != NOT_CALLED])


def _device_dry_run(ctx, comm, calls: dict, timeout: datetime.timedelta, backend: str, count: int) -> dict:
    """A dry run of setup_process_group with ``backend`` while torch.cuda reports ``count`` GPUs: how it ended,
    whether init_process_group was reached, and each GPU selected ([index, joined already])."""
    selected: list = []
    calls.update(init_timeout=NOT_CALLED, dry_run=True)
    try:
        with fake_gpus(count, functools.partial(_note_gpu, selected, calls)):
            outcome = call_outcome(lambda: comm.setup_process_group(ctx.rank, ctx.world_size, backend,
                                                                    init_method=f"file://{ctx.store}.{backend}",
                                                                    timeout=timeout))
    finally:
        calls["dry_run"] = False
    return {"outcome": outcome, "joined": calls["init_timeout"] != NOT_CALLED, "selected": selected}


def _cpu_backend_dry_run(ctx, comm, calls: dict, timeout: datetime.timedelta) -> dict:
    """``_device_dry_run`` with the registered CPU backend ``CPU_BACKEND`` while the most GPUs are reported."""
    register_cpu_backend(CPU_BACKEND)
    return _device_dry_run(ctx, comm, calls, timeout, CPU_BACKEND, max(FAKE_GPU_COUNTS))


def _joined_setup(ctx, comm, calls: dict, all_reduce: Callable, timeout: datetime.timedelta) -> list:
    """The student's setup joining for real: [rank, world size, backend, the all_reduce of rank + 1, the timeout
    init_process_group saw]."""
    import torch.distributed as dist

    _join(ctx, comm, calls, timeout)
    value = torch.tensor([float(ctx.rank + 1)])
    all_reduce(value)
    return [dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), value.item(),
            _timeout_s(calls["init_timeout"])]


def register_cpu_backend(name: str) -> None:
    """Register ``name`` with torch.distributed (once per process) as a CPU backend whose process group is gloo's:
    a backend string ``torch.distributed`` accepts, a real group if joined, and no GPU."""
    import torch.distributed as dist
    if name.lower() not in dist.Backend.backend_list:
        dist.Backend.register_backend(name, _gloo_process_group, devices=["cpu"])


def _gloo_process_group(store, rank: int, world_size: int, timeout: datetime.timedelta):
    """The creator of ``register_cpu_backend``'s backend: gloo's process group over the rendezvous's store."""
    import torch.distributed as dist
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


@contextlib.contextmanager
def fake_gpus(count: int, select: Callable):
    """Inside the block ``torch.cuda`` reports ``count`` available GPUs and ``torch.cuda.set_device(device)``
    calls ``select(device)`` instead of touching one; the real functions afterwards."""
    names = ("is_available", "device_count", "set_device")
    saved = {name: getattr(torch.cuda, name) for name in names}
    torch.cuda.is_available, torch.cuda.device_count, torch.cuda.set_device = (lambda: True), (lambda: count), select
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.cuda, name, function)


def _index(device) -> int | str:
    """The GPU index a ``torch.cuda.set_device`` argument names (an int, ``"cuda:1"``, a ``torch.device``), or
    its text when it names none."""
    if isinstance(device, int):
        return device
    try:
        index = torch.device(device).index
    except (RuntimeError, TypeError):
        return describe(device)
    return describe(device) if index is None else index


@contextlib.contextmanager
def _master_env(env: dict[str, str]):
    """MASTER_ADDR and MASTER_PORT hold exactly ``env`` (a name not in it is unset) inside the block, and what
    they held before afterwards."""
    saved = {name: os.environ.get(name) for name in ENV_NAMES}
    for name in ENV_NAMES:
        os.environ.pop(name, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _text(value) -> str | None:
    """``value`` (an argument the probe records) as None or a string: a result file holds only plain data."""
    return None if value is None else str(value)


def _timeout_s(given) -> float | str:
    """The collective timeout ``dist.init_process_group`` was given, in seconds (torch's default when None), or
    NOT_CALLED."""
    import torch.distributed as dist
    if given is NOT_CALLED:
        return NOT_CALLED
    if given is None:
        return dist.constants.default_pg_timeout.total_seconds()
    return given.total_seconds() if isinstance(given, datetime.timedelta) else f"{describe(given)}"


# ---------------------------------------------------------------- judges (parent side)
def check_setup(run: SplitRun) -> None:
    """Every rank joined through the given init_method as the given rank, world size and backend, with the
    given timeout; the dry runs' ``DryRunStop`` reached the caller; with ``init_method=None`` it used env://,
    keeping the caller's MASTER_* values and defaulting unset ones; with backend="nccl" it selected its own GPU
    (rank % device count) before joining, and with another backend none."""
    call = (f"setup_process_group(rank, {run.world_size}, {SETUP_BACKEND!r}, init_method='file://...', "
            f"timeout={PG_TIMEOUT_S} s)")
    for rank in range(run.world_size):
        try:
            got = run.part(P_SETUP, rank)
        except CheckFailed as failure:
            hint = (f"\nlikely cause: init_method was not used (env:// read MASTER_PORT={UNUSABLE_PORT!r}); "
                    "rendezvous through the URL given as init_method" if UNUSABLE_PORT in str(failure) else "")
            raise CheckFailed(f"{call}: {failure}{hint}") from None
        want = [rank, run.world_size, SETUP_BACKEND, float(sum(range(1, run.world_size + 1)))]
        expect(got[:4] == want, f"{call}: rank {rank} sees [rank, world size, backend, all_reduce of rank+1] = "
               f"{got[:4]}, expected {want} (pass rank, world_size and backend on as given)")
        expect(got[4] in (NOT_CALLED, float(PG_TIMEOUT_S)), f"{call}: rank {rank} called init_process_group with "
               f"a collective timeout of {_seconds(got[4])}, expected the given {PG_TIMEOUT_S} s (pass timeout on)")
        outcome = run.part(P_SETUP_DEFAULT, rank)[0]
        expect(outcome.startswith(DryRunStop.__name__), f"setup_process_group(rank, {run.world_size}, "
               f"{SETUP_BACKEND!r}, init_method='file://...'): rank {rank}: the grader's init_process_group raised "
               f"{DryRunStop.__name__}, and setup_process_group ended with {outcome}: errors from "
               "torch.distributed must propagate to the caller")
        _check_env_rendezvous(run.part(P_SETUP_ENV, rank), rank, run.world_size)
        _check_nccl_device(run.part(P_SETUP_NCCL, rank), rank, run.world_size)
        _check_cpu_backend_device(run.part(P_SETUP_CPU_BACKEND, rank), rank, run.world_size)


def _check_cpu_backend_device(got: dict, rank: int, world_size: int) -> None:
    """With the registered CPU backend ``CPU_BACKEND`` (GPUs reported), rank ``rank`` reached init_process_group and
    selected no GPU."""
    call = (f"setup_process_group(rank, {world_size}, {CPU_BACKEND!r}, init_method='file://...') with "
            f"{max(FAKE_GPU_COUNTS)} GPU(s), {CPU_BACKEND!r} a registered CPU backend")
    expect(got["joined"], f"{call}: rank {rank} never called dist.init_process_group (it ended with "
           f"{got['outcome']})")
    chosen = [index for index, _ in got["selected"]]
    expect(not chosen, f"{call}: rank {rank} called torch.cuda.set_device with {chosen}, expected no call: only "
           f"backend == 'nccl' selects a GPU ({CPU_BACKEND!r} sorts after 'nccl', so a comparison by order such "
           "as >= selects one)")


def _check_nccl_device(seen: dict, rank: int, world_size: int) -> None:
    """With backend="nccl" and N GPUs, rank ``rank`` selected GPU rank % N, once, before init_process_group."""
    for count in FAKE_GPU_COUNTS:
        call = f"setup_process_group(rank, {world_size}, 'nccl', init_method='file://...') with {count} GPU(s)"
        got, want = seen[str(count)], rank % count
        expect(got["joined"], f"{call}: rank {rank} never called dist.init_process_group (it ended with "
               f"{got['outcome']})")
        chosen = [index for index, _ in got["selected"]]
        expect(chosen == [want], f"{call}: rank {rank} called torch.cuda.set_device with {chosen or 'nothing'}, "
               f"expected {want} once (rank % torch.cuda.device_count()), so that each rank drives its own GPU")
        expect(not got["selected"][0][1], f"{call}: rank {rank} selected its GPU after dist.init_process_group; "
               "select it first (NCCL binds the group to the device current when it joins)")


def _check_env_rendezvous(seen: dict, rank: int, world_size: int) -> None:
    """With init_method=None, rank ``rank`` called init_process_group with env:// (or None) while MASTER_ADDR and
    MASTER_PORT held the caller's values (``seen["set"]``) or, where unset, the defaults (``seen["unset"]``)."""
    call = f"setup_process_group(rank, {world_size}, {SETUP_BACKEND!r}, init_method=None)"
    caller = ", ".join(f"{name}={value!r}" for name, value in CALLER_ENV.items())
    for label, want, given in (("set", CALLER_ENV, f"with {caller} set by the caller"),
                               ("unset", DEFAULT_ENV, "with MASTER_ADDR and MASTER_PORT unset")):
        outcome, init = seen[label]["outcome"], seen[label]["init"]
        expect(init != NOT_CALLED, f"{call} {given}: rank {rank} never called dist.init_process_group (it ended "
               f"with {outcome})")
        expect(init["init_method"] in ENV_INIT_METHODS, f"{call} {given}: rank {rank} called init_process_group "
               f"with init_method={init['init_method']!r}, expected 'env://' (None means env://)")
        for name, value in want.items():
            if label == "set":
                expect(init[name] == value, f"{call}: rank {rank} overwrote the caller's {name}={value!r} with "
                       f"{init[name]!r} before init_process_group; use os.environ.setdefault (never overwrite "
                       "values the caller set)")
            else:
                seen_value = "unset" if init[name] is None else f"= {init[name]!r}"
                expect(init[name] == value, f"{call} {given}: rank {rank} called init_process_group with "
                       f"{name} {seen_value}, expected the default {value!r} (os.environ.setdefault)")


def _seconds(value) -> str:
    return f"{value:g} s" if isinstance(value, float) else str(value)


def check_setup_timeout_default(run: SplitRun) -> None:
    """With ``timeout=None`` every rank's setup_process_group called init_process_group with a 60 s timeout; with
    ``timeout=timedelta(0)`` (falsy, but given) with that 0 s timeout."""
    call = f"setup_process_group(rank, {run.world_size}, {SETUP_BACKEND!r}, init_method='file://...', timeout="
    for rank in range(run.world_size):
        outcome, got = run.part(P_SETUP_DEFAULT, rank)
        expect(got != NOT_CALLED, f"{call}None): rank {rank} never called dist.init_process_group (it ended with "
               f"{outcome})")
        expect(got == float(DEFAULT_TIMEOUT_S), f"{call}None): rank {rank} called init_process_group with a "
               f"collective timeout of {_seconds(got)}, expected {DEFAULT_TIMEOUT_S} s (None means 60 s, not "
               f"torch's own default: pass timedelta(seconds={DEFAULT_TIMEOUT_S}) on)")
        outcome, got = run.part(P_SETUP_ZERO, rank)
        expect(got != NOT_CALLED, f"{call}timedelta(0)): rank {rank} never called dist.init_process_group (it "
               f"ended with {outcome})")
        expect(got == ZERO_TIMEOUT.total_seconds(), f"{call}timedelta(0)): rank {rank} called init_process_group "
               f"with a collective timeout of {_seconds(got)}, expected the given 0 s (only None means "
               f"{DEFAULT_TIMEOUT_S} s; a zero timedelta is falsy, so test 'timeout is None', not 'timeout or ...')")
