"""An error in plain words: at the student's file and line, without the libraries' source paths, with the likely
cause of well-known mistakes. The grader (its ranks' ``describe_exception``, ``grading.engine.peers``,
``case_run``) and the entry points (``project.cli.run_cli``, ``project.launch``) tell an error the same way through
``format_error`` and ``traceback_error``; ``EXCEPTION_HINTS`` is the one table of likely causes (the handout's FAQ
lists it too).
"""
from __future__ import annotations

import re
import traceback

from common.rank_reports import library_of, located, split_headline, student_place, traceback_parts
from common.regions import STUDENT_PACKAGES

# (file prefix or "", regex on "Type: message", hint)
EXCEPTION_HINTS: list[tuple[str, re.Pattern, str]] = [
    ("pipeline/pipe.py", re.compile(r"size of tensor a \(\d+\) must match|shape .* (mismatch|invalid)|"
                                    r"mat1 and mat2 shapes cannot be multiplied|Sizes of tensors must match"),
     "a late-binding closure in Pipe.forward: a function defined in the loop reads the loop variables when the "
     "worker runs it, not when it was submitted; bind them as default arguments (lambda x=x, j=j: ...)"),
    ("pipeline/", re.compile(r"TimeoutError|Empty"),
     "a task that was never submitted, or received from the wrong stage: receive exactly what the wave submitted"),
    ("", re.compile(r"not enough values to unpack \(expected 3, got \d+\)"),
     "GPT-2's attention splits the output of c_attn into query, key and value of attn.split_size columns each: "
     "when c_attn's output columns are split over ranks, split_size must be the local width"),
    ("", re.compile(r"Default process group has not been initialized|process group.*not.*initiali[sz]ed"),
     "torch.distributed is used before setup_process_group joined the group (or on another group)"),
    ("", re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"),
     "an in-place change of a parameter outside torch.no_grad()"),
    ("", re.compile(r"Trying to backward through the graph a second time"),
     "a tensor reused across steps keeps an old graph: detach it or rebuild it each step"),
    ("", re.compile(r"element \d+ of tensors does not require grad"),
     "the graph was cut: a .detach(), .data or torch.no_grad() between the input and the loss"),
    ("", re.compile(r"the communication library refused to join the group: rank \d+ is not below the world size"),
     "a rank number not below the world size: the group was joined with a wrong world size or rank (each of the "
     "world_size ranks joins with its own rank, 0 <= rank < world_size; pass setup_process_group's arguments "
     "through to init_process_group)"),
    ("", re.compile(r"the communication library refused the call: two of its tensors differ in size"),
     "the tensors of one collective call do not fit each other on this rank (the two sizes it names): in "
     "reduce_scatter and all_gather every chunk has the same size on every rank (pad a flat buffer to a multiple "
     "of the world size)"),
]
_LIBRARY_CHECK = re.compile(r"Check failed: .*sizes\(\).*\((?P<a>\d+) vs\. (?P<b>\d+)\)")
# A C++ log prefix the communication library puts before its message ("[rank2]:[F1205 18:36:15.19 Foo.cpp:2216] ",
# "[/path/to/pair.cc:553] "): a source path of the library's, not of the student's code.
_LIBRARY_PREFIX = re.compile(r"(?:\[rank\d+\]:)?\[(?:[A-Z]\d{4} [\d:.]+ |enforce fail at )?[^\]\s]*"
                             r"\.(?:cpp|cc|h|hpp):\d+\]\s*")
# gloo's assertion that a rank joins a group below its size ("[enforce fail at .../context.cc:23] rank < size. 1 vs 1")
_RANK_NOT_BELOW_SIZE = re.compile(r"^(?:Error: )?rank < size\. (?P<rank>\d+) vs (?P<size>\d+)\s*$")
# A path of an installed library's source file in a message (".../site-packages/torch/nn/functional.py", line N)
_LIBRARY_PATH = re.compile(r"/[^\s\"':]*/(?:site|dist)-packages/[^\s\"':]+")
# gloo's advice after a peer's failure, the same words on every error it raises ("This is typically caused by a
# remote worker ... GLHF! <emoji>"): the message before it says what happened.
_LIBRARY_BANNER = re.compile(r"\s*This is typically caused by .*?GLHF!\s*\S*")
# A loopback address's port in a library's message ("Connection closed by peer [127.0.0.1]:15752"): new every run.
_LOOPBACK_PORT = re.compile(r"(\[?(?:127\.0\.0\.1|::1|localhost)\]?):\d{1,5}\b")


def likely_cause(kind: str, message: str, where: str = "") -> str:
    """A "likely cause: ..." sentence for a known failure shape, or "" when none is known."""
    text = f"{kind}: {message}"
    for prefix, pattern, hint in EXCEPTION_HINTS:
        if where.startswith(prefix) and pattern.search(text):
            return f"likely cause: {hint}"
    return ""


def self_contained(message: str) -> str:
    """``message`` whose first line no longer ends at a colon: the next non-empty line is joined onto it.

    torch's ``load_state_dict`` error opens with "Error(s) in loading state_dict for Net:" and lists the details
    on the following lines; a grade table shows the first line only, so
    ``"Error(s) ... for Net:\n\tMissing key(s) in state_dict: "b". "`` becomes
    ``"Error(s) ... for Net: Missing key(s) in state_dict: "b"."``. Any other message comes back unchanged.
    """
    lines = message.split("\n")
    if not lines[0].rstrip().endswith(":"):
        return message
    for k, line in enumerate(lines[1:], start=1):
        if line.strip():
            return "\n".join([f"{lines[0].rstrip()} {line.strip()}", *lines[k + 1:]])
    return message


def plain(message: str) -> str:
    """A rank's message as the default table may show it: no C++ source prefix of the communication library
    (``[/__w/pytorch/.../pair.cc:537] ``, ``[enforce fail at .../context.cc:23] ``) and no installed library's
    source path (a path under ``site-packages`` reads as its module: ``torch.nn``), no banner of gloo's (``This is
    typically caused by ... GLHF!``), no port of a loopback address (``[127.0.0.1]:15752`` reads ``[127.0.0.1]``:
    ports change from run to run, and a message must not)."""
    message = _LOOPBACK_PORT.sub(r"\1", _LIBRARY_BANNER.sub("", _LIBRARY_PREFIX.sub("", message)))
    return _LIBRARY_PATH.sub(lambda match: library_of(match.group(0)) or "a library file", message)


def format_error(kind: str, message: str, where: str = "", library: str = "") -> str:
    """``"Type: message (at path:line (in fn))"``, plus ``"\nlikely cause: ..."`` when one is known.

    ``where`` is ``student_frame``'s answer ("" when no student frame was found: no location is shown);
    ``library`` the library that raised the exception below that frame (``library_frame``: `` (at ...; raised
    inside torch.nn)``). The location follows the message's first line (``common.rank_reports.headline``: a
    sentence wrapped over lines is joined first), so a table that shows one line shows it; the further lines follow. A
    message whose first line ends at a colon gets its details joined onto that line (``self_contained``); library
    source paths are left out (``plain``).
    """
    message, check = _plain_library_check(plain(self_contained(message)).rstrip())
    first, rest = split_headline(message)
    text = (f"{kind}: {first}" + located(where, library) + (f"\n{rest}" if rest else "")
            + (f"\nlibrary check: {check}" if check else ""))
    hint = likely_cause(kind, message, where)
    return text + (f"\n{hint}" if hint else "")


def _plain_library_check(message: str) -> tuple[str, str]:
    """(``message``, "") or, when it is a communication library's failed assertion (gloo's ``Check failed:
    EXPR (A vs. B).`` on sizes, its ``rank < size. A vs B`` when a group is joined), (the same in plain words, the
    assertion: a later line, which ``grade -v`` shows)."""
    joined = _RANK_NOT_BELOW_SIZE.match(message)
    if joined:
        return (f"the communication library refused to join the group: rank {joined['rank']} is not below the world "
                f"size {joined['size']}"), message
    match = _LIBRARY_CHECK.match(message)
    if not match or "\n" in message:
        return message, ""
    return (f"the communication library refused the call: two of its tensors differ in size ({match['a']} vs. "
            f"{match['b']} elements)"), message


def student_frame(tb: traceback.StackSummary | list) -> str:
    """``"path:line (in function)"`` where the student's code failed (``common.rank_reports.student_place``) in
    ``tb`` (``traceback.extract_tb(exc.__traceback__)``, innermost frame last), or "" when no frame is the
    student's."""
    return student_place([(frame.filename, frame.lineno or 0, frame.name) for frame in tb], STUDENT_PACKAGES)


def library_frame(tb: traceback.StackSummary | list) -> str:
    """The library that raised an exception, named by module (``torch.distributed``, ``transformers``), when its
    innermost frame ``tb`` (``traceback.extract_tb``) is a library's; else ""."""
    frames = list(tb)
    return library_of(frames[-1].filename) if frames else ""


def describe_exception(exc: BaseException, limit: int | None = None) -> str:
    """``format_error`` of a caught exception: its type, message (cut to ``limit`` characters), the student file and
    line it came from (``student_frame``) and the likely cause."""
    message, tb = str(exc), traceback.extract_tb(exc.__traceback__)
    return format_error(type(exc).__name__, message[:limit] if limit else message, student_frame(tb),
                        library_frame(tb))


def traceback_error(text: str) -> str:
    """A rank's formatted traceback as the default table shows an error: ``format_error``'s first line (the
    message in plain words, at the student's file and line, the library that raised it)."""
    exception, where, library = traceback_parts(text, STUDENT_PACKAGES)
    kind, _, message = exception.partition(": ")
    if not message and " " in kind.strip():
        kind, message = "Error", kind
    return format_error(kind.strip(), message, where, library).splitlines()[0]


def traceback_hint(text: str) -> str:
    """The ``likely cause:`` line of a rank's formatted traceback (``likely_cause``), or ""."""
    exception, where, _ = traceback_parts(text, STUDENT_PACKAGES)
    kind, _, message = exception.partition(": ")
    shown = format_error(kind.strip(), message, where).splitlines()
    return next((line for line in shown if line.startswith("likely cause:")), "")


def explained_traceback(text: str) -> list[str]:
    """The last lines of an entry point that failed with the formatted traceback ``text`` (an exception raised in
    its own process): ``error: `` and ``traceback_error``, then the likely cause where one is known."""
    return [f"error: {traceback_error(text)}", *filter(None, [traceback_hint(text)])]
