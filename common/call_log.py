"""Every collective call a rank makes, with where it was made: the record that names the call on which ranks part.

``install`` wraps the communication functions of ``torch.distributed`` in a rank process so that each call appends
one line to that rank's log file (the op, its tensor, its peer, the student's file and line) before it runs; a rank
logs its first ``MAX_CALLS`` calls. After a failure, ``read`` brings every rank's log back (bounded: what a rank
wrote there is data) and ``divergence`` / ``parting`` compare them call by call: the first collective call where
the ranks differ (by op, tensor, or the file and function it comes from), calls one rank never made (a skipped
call or a whole step), and ranks that wait in point-to-point calls for each other (a deadlock) are each named as
what they are. The grader's engine (``grading.engine.worker`` logs, ``grading.engine.peers`` explains) and the
entry points (``project.launch``) explain a rank disagreement with it.
"""
from __future__ import annotations

import functools
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from common.files import append_regular, read_regular
from common.rank_reports import package_path

# The functions of torch.distributed whose calls are logged: every collective and blocking point-to-point call a student
# makes (the object collectives included).
TRACED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
          "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
          "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
          "send", "recv")
# isend and irecv are not wrapped: torch.distributed.P2POp accepts only the functions themselves.
POINT_TO_POINT = ("send", "recv")
# Libraries that make collective calls for the student's code (named after its place), and modules whose frames
# only pass a call on (never named as its place).
_LIBRARIES = ("deepspeed", "transformers", "peft", "accelerate")
_WRAPPERS = ("torch", "functools", "contextlib", "common", "grading")
GRADER_SITE = "in the grader's own code"     # the place of a call the grader's probe makes itself
_FIELDS = 5            # number, op, tensor, peer, site: one tab-separated line per call
# A rank logs its first MAX_CALLS calls only (about 100 bytes each: a log stays far below any file size limit, and a
# loop of calls cannot fill a disk); its log then ends with the STOPPED line, and ``parting`` compares only the
# calls every rank logged.
MAX_CALLS = 20_000
STOPPED = "# stopped logging after MAX_CALLS calls"
_MAX_FIELD = 300       # what ``read`` keeps of each field (a rank may write anything in its log)


@dataclass(frozen=True)
class Call:
    """One logged call: its number on the rank (from 1), the function, its tensor (``"float32 [8, 6]"``, or
    ``"3 x float32 [4]"`` for a list), its peer (``"to 1"``, ``"from 0"``, ``"root 0"``, or ""), and where the
    student's code made it (``"data_parallel/comm.py:69 (in average_gradients)"``; a library that made it for
    them is named after it: ``"... via deepspeed"``)."""

    number: int
    op: str
    tensor: str
    peer: str
    site: str

    def call(self) -> str:
        """``all_reduce(float32 [8, 6])`` (``barrier`` for a call without a tensor): the call without its place."""
        inside = ", ".join(part for part in (self.tensor, self.peer) if part)
        return f"{self.op}({inside})" if inside else self.op

    def described(self) -> str:
        """The call with its place: ``all_reduce(float32 [8, 6]) at data_parallel/comm.py:69 (in f)``."""
        if not self.site:
            return self.call()
        return self.call() + (f" {self.site}" if self.site.startswith(("in ", "inside ")) else f" at {self.site}")


def install(log_path: Path, packages: tuple[str, ...], dist: ModuleType | None = None) -> None:
    """From now on, log each call this process makes to a ``TRACED`` function of ``dist`` (``torch.distributed``)
    to ``log_path`` (one line per call, written before the call runs), its place read in ``packages``. A log that
    exists already is added to, its numbers going on from its last: the rank processes of a case's later phase
    continue their rank's log, so the calls where the ranks first parted stay in it.

    ``dist`` defaults to ``torch.distributed`` as this process has imported it (``common`` imports the standard
    library only: the caller hands the module in, or imports it first); when it is not imported, nothing is
    logged. Wraps the module's attributes, so code that looks a function up on ``torch.distributed`` at call
    time, or imports it after this, is logged; a second ``install`` in the same process does nothing. Calls made
    by torch's own C++ code (DistributedDataParallel's reducer) are not logged.
    """
    dist = dist if dist is not None else sys.modules.get("torch.distributed")
    if dist is None or getattr(dist, "_kit_call_log", None) is not None:
        return
    logged = max((call.number for call in read(log_path)), default=0)
    stream = append_regular(log_path)       # noqa: SIM115 - open for the process's life
    counter = iter(range(logged + 1, MAX_CALLS + 2))
    for name in TRACED:
        original = getattr(dist, name, None)
        if callable(original):
            setattr(dist, name, _traced(name, original, stream, counter, packages))
    dist._kit_call_log = log_path


def _traced(name: str, original, stream, counter, packages: tuple[str, ...]):
    @functools.wraps(original)
    def traced(*args, **kwargs):
        number = next(counter, None)
        try:
            if number is not None and number > MAX_CALLS:
                stream.write(STOPPED + "\n")
            elif number is not None:
                fields = (str(number), name, _tensor_of(args, kwargs), _peer_of(name, args, kwargs), _site(packages))
                stream.write("\t".join(field.replace("\t", " ").replace("\n", " ") for field in fields) + "\n")
        except Exception:  # noqa: BLE001 - a full disk, a closed log or an odd argument must not change the call
            pass
        return original(*args, **kwargs)
    return traced


def _tensor_of(args: tuple, kwargs: dict) -> str:
    """The tensor a call works on, in words: its first tensor argument, or its first list of tensors (a tensor:
    anything with a ``dtype`` and a ``shape``)."""
    for value in [*args[:2], *kwargs.values()]:
        if _is_tensor(value):
            return _shape(value)
        if isinstance(value, (list, tuple)) and value and all(_is_tensor(v) for v in value):
            return f"{len(value)} x {_shape(value[0])}"
    return ""


def _is_tensor(value) -> bool:
    return hasattr(value, "dtype") and isinstance(getattr(value, "shape", None), tuple)


def _shape(tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} [{', '.join(map(str, tensor.shape))}]"


def _peer_of(name: str, args: tuple, kwargs: dict) -> str:
    """``to 1`` / ``from 0`` for a point-to-point call, ``root 0`` for a rooted collective, else ""."""
    if name in POINT_TO_POINT:
        key = "dst" if name == "send" else "src"
        peer = kwargs.get(key, args[1] if len(args) > 1 else None)
        return "" if peer is None else f"{'to' if key == 'dst' else 'from'} {peer}"
    for key in ("src", "dst"):
        if kwargs.get(key) is not None:
            return f"root {kwargs[key]}"
    if name in ("broadcast", "reduce", "gather", "scatter") and len(args) > 1 and isinstance(args[1], int):
        return f"root {args[1]}"
    return ""


def _site(packages: tuple[str, ...]) -> str:
    """Where the innermost frame in the student's ``packages`` is, and the library between it and the call."""
    frame = inspect.currentframe()
    library, outer, grader = "", "", False
    try:
        frame = frame.f_back.f_back if frame is not None else None    # the caller of ``traced``
        while frame is not None:
            where = _package_path(frame.f_code.co_filename, packages)
            if where:
                return f"{where}:{frame.f_lineno} (in {frame.f_code.co_name})" + (f" via {library}" if library else "")
            module = str(frame.f_globals.get("__name__", ""))
            if not library and module.split(".")[0] in _LIBRARIES:
                library = module.split(".")[0]
            if not outer and module.split(".")[0] not in _WRAPPERS:
                outer = f"{module}:{frame.f_lineno} (in {frame.f_code.co_name})"
            grader = grader or module.split(".")[0] == "grading"
            frame = frame.f_back
        return f"inside {outer}" if outer else (GRADER_SITE if grader else "")
    finally:
        del frame


@functools.lru_cache(maxsize=4096)
def _package_path(filename: str, packages: tuple[str, ...]) -> str:
    """``package_path``, once per source file (``_site`` asks for every frame of every call)."""
    return package_path(filename, packages)


def read(path: Path, limit_bytes: int = 4_000_000) -> list[Call]:
    """The calls logged in ``path`` (at most its first ``limit_bytes``; [] when it is missing, or is not a regular
    file: a rank may leave a link or a pipe there); lines that are not a logged call are skipped (``parse``)."""
    try:
        return parse(read_regular(path, limit=limit_bytes).decode("utf-8", "replace"))
    except OSError:
        return []


def parse(text: str) -> list[Call]:
    """The calls of a log's text (what ``install`` writes), in order; other lines are skipped, each field is kept to
    its first few hundred characters, and a log that ``install`` stopped (``MAX_CALLS``) ends with a ``Call`` whose
    op is ``STOPPED``."""
    calls = []
    for line in text.splitlines()[:MAX_CALLS + 1]:
        fields = line.split("\t")
        if len(fields) == _FIELDS and fields[0].isdigit() and len(fields[0]) < 12:
            calls.append(Call(int(fields[0]), *(field[:_MAX_FIELD] for field in fields[1:])))
        elif line == STOPPED:
            calls.append(Call(len(calls) + 1, STOPPED, "", "", ""))
            break
    return calls


def parting(logs: dict[int, list[Call]], waiting: dict[int, str] | None = None,
            ended: frozenset[int] | set[int] = frozenset()) -> str | None:
    """``divergence``'s words alone."""
    found = divergence(logs, waiting, ended)
    return found[1] if found else None


def divergence(logs: dict[int, list[Call]], waiting: dict[int, str] | None = None,
               ended: frozenset[int] | set[int] = frozenset()) -> tuple[str, str] | None:
    """What the ranks' call logs (rank -> its calls in order) show about a failure: (its kind, "deadlock",
    "differ", "step" or "missing", and it in words), or None when they show nothing wrong.

    ``waiting`` (rank -> the function a rank was stuck in, from a stack dump) is optional; ``ended`` are ranks that
    stopped before their time (a crash, a kill, the time limit): that such a rank made fewer calls says nothing.
    In order of what is read: ranks whose last calls are point-to-point calls that wait for each other (a
    deadlock); the first collective call where the ranks' calls differ in op, tensor or peer, or (same call) in
    their file or function (``_function``); collective calls that one rank made and another never did (a skipped
    call or step).
    Point-to-point calls are paired by their peers, not in order, so only the deadlock reads them; a log that
    ``install`` stopped (``MAX_CALLS``) is compared as far as every rank logged.
    """
    logs = {rank: calls for rank, calls in sorted(logs.items())}
    if len(logs) < 2:
        return None
    capped = any(calls and calls[-1].op == STOPPED for calls in logs.values())
    logs = {rank: [c for c in calls if c.op != STOPPED] for rank, calls in logs.items()}
    deadlock = _deadlock(logs, waiting or {})
    if deadlock:
        return "deadlock", deadlock
    aligned = {rank: [c for c in calls if c.op not in POINT_TO_POINT] for rank, calls in logs.items()}
    shortest = min(len(calls) for calls in aligned.values())
    for index in range(shortest):
        here = {rank: calls[index] for rank, calls in aligned.items()}
        if len({(c.op, c.tensor, c.peer) for c in here.values()}) > 1:
            return "differ", _differ(index, here, f"their collective call number {index + 1}")
        if len({_function(c.site) for c in here.values()}) > 1:
            return "differ", _differ(index, here, f"where their collective call number {index + 1} comes from")
    longest = max(len(calls) for calls in aligned.values())
    short = {rank for rank, calls in aligned.items() if len(calls) == shortest}
    if longest == shortest or capped or short & set(ended):
        return None
    long_rank = max(aligned, key=lambda rank: len(aligned[rank]))
    return ("step" if _is_a_step(aligned[long_rank], shortest) else "missing"), _missing(aligned, shortest)


def _function(site: str) -> str:
    """A call's place without its line: the same call from two lines of one function (a rank-dependent branch that
    sends its own buffer) is no divergence, from two functions (a forward's all-reduce paired with a backward's)
    is."""
    return re.sub(r":\d+", "", site)


def _differ(index: int, here: dict[int, Call], what: str) -> str:
    """The ranks' calls ``here`` (their number ``index + 1``) on which they disagree about ``what``, ranks with the
    same call grouped."""
    groups: dict[str, list[int]] = {}
    for rank, call in here.items():
        groups.setdefault(call.described(), []).append(rank)
    listed = "; ".join(f"{_ranks(ranks)} {'call' if len(ranks) > 1 else 'calls'} {described}"
                       for described, ranks in groups.items())
    return (f"ranks disagree on {what}: {listed}\n"
            "likely cause: every rank must make the same collective calls in the same order with the same shapes; "
            "a rank that skips a call, or makes them in another order, pairs its calls with different ones on the "
            "other ranks")


def _missing(logs: dict[int, list[Call]], shortest: int) -> str:
    short = [rank for rank, calls in logs.items() if len(calls) == shortest]
    long_rank = max(logs, key=lambda rank: len(logs[rank]))
    extra = logs[long_rank][shortest:]
    places: dict[str, int] = {}
    for call in extra:
        places[call.described()] = places.get(call.described(), 0) + 1
    shown = "; ".join(f"{described}{f' x{n}' if n > 1 else ''}" for described, n in list(places.items())[:4])
    last = logs[short[0]][-1].described() if logs[short[0]] else "none"
    skipped = "a whole step" if _is_a_step(logs[long_rank], shortest) else "a call"
    return (f"{_ranks(short)} made {shortest} collective call{'s' if shortest != 1 else ''} where rank {long_rank} "
            f"made {len(logs[long_rank])}: rank {long_rank}'s calls from number {shortest + 1} on ({shown}) have no "
            f"partner on {_ranks(short)}, whose last call was {last}\n"
            f"likely cause: {_ranks(short)} skipped {skipped}"
            " (a branch, an early return or a loop that depends on the rank): every rank must make the same "
            "collective calls")


def _is_a_step(calls: list[Call], shortest: int) -> bool:
    """True when the calls repeat with a period of two calls or more (a training step's calls, place by place) and
    ``shortest`` is a whole number of periods: the short rank made whole steps' calls and skipped the next step
    (the longer rank went on into it)."""
    keys = [c.site + c.call() for c in calls]
    for period in range(2, shortest + 1):
        if shortest % period == 0 and all(keys[i] == keys[i - period] for i in range(period, len(keys))):
            return True
    return False


def _deadlock(logs: dict[int, list[Call]], waiting: dict[int, str]) -> str | None:
    last = {rank: calls[-1] for rank, calls in logs.items() if calls}
    if len(last) != len(logs) or not all(call.op in ("send", "recv") for call in last.values()):
        return None
    if waiting and any(waiting.get(rank) not in (None, "", call.op) for rank, call in last.items()):
        return None
    kinds = {call.op for call in last.values()}
    if len(kinds) != 1:
        return None
    op = kinds.pop()
    listed = "; ".join(f"rank {rank} {call.described()}" for rank, call in last.items())
    every = "both ranks wait" if len(last) == 2 else "every rank waits"
    return (f"{every} in {op}, so none gets what it waits for (a deadlock): {listed}\n"
            f"likely cause: a {op} must meet a {'recv' if op == 'send' else 'send'} on its peer; order the calls so "
            "that one rank sends while the other receives")


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
