"""When ranks disagree: the rank at fault first, the other ranks' errors as its symptoms.

A rank whose peer failed sees only the communication library's side of it; ``explain`` turns such a symptom,
read on one rank for one recorded part, into a message whose first line names the rank at fault and what it did,
in the student's own file and line.
"""
from __future__ import annotations

import re
from typing import Protocol, Sequence

from common import call_log
from common.rank_reports import dump_place, is_symptom
from common.rank_reports import ending as rank_ending
from common.regions import STUDENT_PACKAGES
from common.error_words import format_error, likely_cause, plain, traceback_error


class Outcome(Protocol):
    """How one rank ended, as ``explain`` reads it (``grading.engine.case_run.RankOutcome``)."""

    returncode: int | None
    finished: bool
    error: str
    stack: str
    stderr_tail: str


class Launched(Protocol):
    """The ranks of a run (``grading.engine.case_run.LaunchResult``)."""

    ranks: Sequence[Outcome]


class Run(Protocol):
    """What ``explain`` reads of a finished case (``grading.engine.case_run.CaseRun``)."""

    world_size: int
    launch: Launched

    def outcome(self, name: str, rank: int) -> tuple[str, dict | None]:
        """("value" | "error" | "missing", the recorded error or None) of part ``name`` on ``rank``."""

    def first_symptom(self, rank: int) -> str | None:
        """The first part ``rank`` recorded a symptom error for, or None."""

    def call_logs(self) -> dict[int, list[call_log.Call]]:
        """Every rank's logged calls (``common.call_log.read``); {} when the run kept none."""

_MISMATCH = re.compile(r"Detected mismatch between collectives")
_OWN_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                              r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\])?(?:, TensorDtypes=(\w+))?")
# torch's OpType names in collective fingerprints, as the public functions a student calls
_OP_NAMES = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
             "_ALLGATHER_BASE": "all_gather_into_tensor", "ALLGATHER_COALESCED": "all_gather_coalesced",
             "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
             "BARRIER": "barrier", "GATHER": "gather", "SCATTER": "scatter", "REDUCE": "reduce",
             "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all_single", "SEND": "send", "RECV": "recv"}
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Bool": "bool"}
# A frame of torch.distributed's Python API in a traceback ("File ..., line N, in all_reduce") or a
# faulthandler dump ("File ..., line N in all_reduce"): the collective a rank was in.
_C10D_FRAME = re.compile(r'File "[^"]*torch/distributed/distributed_c10d\.py", line \d+,? in (\w+)')


def collective(info: dict) -> str:
    """The torch.distributed function a recorded error was raised in ("all_reduce"), or "a collective"."""
    found = _C10D_FRAME.findall(str(info.get("traceback", "")))
    if found:
        return found[-1]
    match = _OWN_FINGERPRINT.search(str(info.get("message", "")))
    return _OP_NAMES.get(match.group(2), match.group(2).lower()) if match else "a collective"


def call_of(info: dict) -> str:
    """The collective call of a recorded error, with its tensor when torch's collective check printed it:
    ``"all_reduce(float32 [8, 6])"``, else the function name alone."""
    match = _OWN_FINGERPRINT.search(str(info.get("message", "")))
    if not match or not match.group(3):
        return collective(info)
    return _fingerprint_call(match, collective(info))


def peer_calls(info: dict) -> dict[int, str]:
    """The calls torch's collective check saw the other ranks make, from a recorded mismatch error
    (rank -> ``"all_reduce(float32 [8, 6])"``); empty for any other error."""
    found = list(_OWN_FINGERPRINT.finditer(str(info.get("message", ""))))[1:]
    return {int(m.group(1)): _fingerprint_call(m, _OP_NAMES.get(m.group(2), m.group(2).lower())) for m in found}


def _fingerprint_call(match: re.Match, name: str) -> str:
    """``name(dtype [shape])`` from a matched collective fingerprint, or ``name`` when it shows no tensor."""
    if not match.group(3):
        return name
    shape = ", ".join(re.findall(r"\d+", match.group(3)))
    return f"{name}({_DTYPES.get(match.group(4) or '', match.group(4) or '?')} [{shape}])"


def ending(outcome: Outcome) -> str:
    """How a rank that did not finish ended, in plain words (``common.rank_reports.ending``)."""
    return rank_ending(outcome.returncode, outcome.stack, outcome.stderr_tail, STUDENT_PACKAGES)


def explain(run: Run, name: str, rank: int, info: dict | None) -> str | None:
    """The message for part ``name`` of ``rank`` when what it shows is a symptom of another rank's fault (or of
    ranks that disagree), else None.

    ``info`` is the error ``rank`` recorded for ``name`` (None: it recorded nothing, because it did not finish).
    The first line names the rank at fault and what it did: its own exception (at its file and line), the first
    call on which the ranks' call logs part (``common.call_log.parting``: calls that differ, or come from
    different places in the code, a skipped call or step, ranks that wait in point-to-point calls for each other),
    the collective calls torch saw the ranks disagree on, a rank that returned without the collective this rank
    waits in, or how a rank ended (a crash, a signal, a hang). A ``symptom:`` line says what ``rank`` was doing
    meanwhile; the raw text of its error follows on a later line.
    """
    found = _explain(run, name, rank, info)
    return found[0] if found else None


def _explain(run: Run, name: str, rank: int, info: dict | None) -> tuple[str, str] | None:
    """(``explain``'s message, the kind of fault it names: "exception", "calls" or "ended"), or None."""
    outcome = run.launch.ranks[rank] if rank < len(run.launch.ranks) else None
    if info is not None:
        if not is_symptom(f"{info.get('type')}: {info.get('message')}"):
            return None
        own_op, own_where = collective(info), str(info.get("where") or "")
        doing = f"was waiting in {own_op}" + (f" at {own_where}" if own_where else "")
        raw = f"rank {rank}'s own error: {info.get('type')}: {plain(str(info.get('message')))[:1500]}"
    elif outcome is not None and not outcome.finished and outcome.returncode != 0 and not outcome.error:
        own_op, own_where = dump_place(outcome.stack, STUDENT_PACKAGES)
        doing, raw = ending(outcome), ""
        if outcome.returncode is None:         # killed at the time limit: explained only by the calls' logs
            parted = _parting(run, rank, own_op)
            return (f"{parted[0]}\nsymptom: rank {rank} {doing}", "calls") if parted else None
    else:
        return None
    earlier = run.first_symptom(rank)
    if info is not None and earlier not in (None, name):
        first = _explain(run, earlier, rank, run.outcome(earlier, rank)[1])
        if first:
            lines = [line for line in first[0].splitlines() if not line.startswith(("symptom:", f"rank {rank}'s own"))]
            since = (": its collective calls were out of step with the other ranks' since that call"
                     if first[1] == "calls" else ", after the failure above (its peers had stopped taking part)")
            return "\n".join([*lines, f"symptom: rank {rank} {doing}{since}", raw]), first[1]
    fault = _fault(run, name, rank, own_op, own_where, info)
    if fault is None:
        headline = f"rank {rank} {doing}" if info is None else (
            f"rank {rank}: {own_op} failed because another rank stopped taking part"
            + (f" (at {own_where})" if own_where else ""))
        return "\n".join(line for line in (headline, raw) if line), "ended"
    lines, when, kind = fault
    symptom = "" if when is None else f"symptom: rank {rank} {doing}{when}"
    return "\n".join(line for line in (lines, symptom, raw) if line), kind


def _parting(run: Run, rank: int, own_op: str = "") -> tuple[str, bool] | None:
    """(what the ranks' call logs show, whether it is only that some rank made fewer collective calls) from
    ``common.call_log.parting``, or None when the run has no logs or they show nothing. A rank's stack dump says
    which call it was stuck in; a rank that crashed or hung outside a call may have made fewer calls for that."""
    logs = run.call_logs() if hasattr(run, "call_logs") else {}
    if len(logs) < 2:
        return None
    waiting, ended = {}, set()
    for p, peer in enumerate(run.launch.ranks):
        op = own_op if p == rank else dump_place(peer.stack, STUDENT_PACKAGES)[0]
        if op:
            waiting[p] = op
        elif not peer.finished and peer.returncode != 0 and not peer.error:
            ended.add(p)
    found = call_log.divergence(logs, waiting, ended)
    return (found[1], found[0] == "missing") if found else None


def _fault(run: Run, name: str, rank: int, own_op: str, own_where: str,
           info: dict | None) -> tuple[str, str | None, str] | None:
    """(the lines naming the rank at fault, what ends ``explain``'s symptom line: None for no symptom line, the
    kind of fault: "exception", "calls" or "ended") for ``explain``; None when no peer explains the failure."""
    peers = [p for p in range(run.world_size) if p != rank]
    outcomes = {p: run.outcome(name, p) for p in peers}
    for p, (kind, peer_info) in outcomes.items():          # a peer's own exception in the same part
        if kind == "error" and not is_symptom(f"{peer_info.get('type')}: {peer_info.get('message')}"):
            return f"rank {p}: " + _error_line(peer_info), f" when rank {p} failed", "exception"
    for p in peers:                                       # a peer's exception outside any recorded part
        text = run.launch.ranks[p].error if p < len(run.launch.ranks) else ""
        if text.strip() and not is_symptom(text):
            return (f"rank {p} failed outside the graded calls: {traceback_error(text)}",
                    f" when rank {p} failed", "exception")
    parted = _parting(run, rank, own_op)
    if parted and not parted[1]:                          # the calls' logs part: the first call that differs
        return parted[0], None, "calls"
    waiting = {p: i for p, (kind, i) in outcomes.items() if kind == "error"}
    if info is not None:
        waiting[rank] = info
    calls: dict[str, list[int]] = {}
    for p, i in sorted(waiting.items()):
        calls.setdefault(call_of(i) + (f" at {i['where']}" if i.get("where") else ""), []).append(p)
    if len(calls) >= 2:
        listed = "; ".join(f"rank{'s' if len(ps) > 1 else ''} {', '.join(map(str, ps))} "
                           f"call{'' if len(ps) > 1 else 's'} {call}" for call, ps in calls.items())
        return (f"ranks disagree on a collective call: {listed}\nlikely cause: every rank must make the same "
                "collective calls in the same order with the same shapes; a rank that skips a call, or makes "
                "them in another order, pairs its calls with different ones on the other ranks"), None, "calls"
    function = re.search(r"\(in (\w+)\)$", own_where)
    for p, (kind, _) in outcomes.items():                  # a peer that returned without the collective
        seen = peer_calls(info or {}).get(p)
        if kind == "value" and seen and not own_where:     # this rank left the student's code, the peer did not
            return (f"rank {rank} went on without the {seen} that rank {p} makes (rank {rank} is already in "
                    f"{call_of(info)}, outside your code)\nlikely cause: rank {rank} skipped a collective call (a "
                    "branch or an early return that depends on the rank): every rank must make the same collective "
                    "calls"), None, "calls"
        if kind == "value" and info is not None and own_op != "a collective":
            left = f"returned from {function.group(1)}" if function else "went on"
            return (f"rank {p} {left} without the {own_op} that rank {rank} waits in"
                    + (f" at {own_where}" if own_where else "")
                    + f"\nlikely cause: rank {p} skipped a collective call (a branch or an early return that "
                    "depends on the rank): every rank must make the same collective calls"), None, "calls"
    if parted:                                            # a rank made fewer collective calls than the others
        return parted[0], None, "calls"
    for p in peers:                                       # a peer that crashed, was killed or hung
        peer = run.launch.ranks[p] if p < len(run.launch.ranks) else None
        if peer is not None and not peer.finished and (peer.returncode != 0 or peer.returncode is None):
            return f"rank {p} {ending(peer)}", f" when rank {p} stopped", "ended"
    return None


def _error_line(info: dict) -> str:
    """``Type: message (at path:line (in fn))`` of a recorded error, on one line (its ``headline``, location
    kept), with its likely cause."""
    kind, message = str(info.get("type", "Error")), str(info.get("message", ""))
    where, library = str(info.get("where") or ""), str(info.get("library") or "")
    lines = format_error(kind, message, where, library).splitlines()
    hint = likely_cause(kind, message, where) or next((x for x in lines if x.startswith("likely cause:")), "")
    return lines[0] + (f"\n{hint}" if hint else "")
