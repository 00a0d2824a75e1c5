"""The handout's FAQ: generated from the grader's likely-cause hints where they are data, the rest hand-written.

- ``common.error_words.EXCEPTION_HINTS`` (file prefix, pattern, hint):
  one entry each, for the hints whose file belongs to a chosen problem;
- ``grading.kit.region_hints.static_hints``: one entry showing what it prints for
  a late-binding closure, produced by running it on a small example;
- ``faq.md`` (next to this file): the hand-written entries every course gets;
- ``faq.md`` in a sub-problem's folder (``grading/problems/p1_2_comm/faq.md``): the hand-written entries of a
  folder whose checks print their own likely causes (code, not data), shown when the course hands it out.
"""
from __future__ import annotations

import re
from pathlib import Path

from common import error_words
from grading.kit.region_hints import static_hints
from grading.problems import folders

FAQ_FILE = Path(__file__).resolve().parent / "faq.md"
FOLDER_FAQ = "faq.md"                     # a sub-problem's own entries, in its folder
_CLOSURE_EXAMPLE = """\
for j, stage in enumerate(stages):
    tasks.append(lambda: stage(x))
"""


def _entries(path: Path) -> str:
    """The entries (markdown) of a FAQ file, comments dropped."""
    return re.sub(r"<!--.*?-->", "", path.read_text(), flags=re.DOTALL).strip()


def sections() -> dict[str, str]:
    """The hand-written entries by key: "common" (``faq.md`` here), then each sub-problem id ("1.2", ...) whose
    folder holds a ``faq.md``, in rubric order."""
    found = {"common": _entries(FAQ_FILE)}
    for sub, package in folders().items():
        path = Path(package.__file__).parent / FOLDER_FAQ
        if path.is_file():
            found[sub] = _entries(path)
    return found


def readable(pattern: str) -> list[str]:
    """The top-level alternatives of a hint's regex, written for people (``\\d+`` -> N, ``.*`` -> ...)."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(pattern):
        depth += (ch == "(" and pattern[k - 1:k] != "\\") - (ch == ")" and pattern[k - 1:k] != "\\")
        if ch == "|" and depth == 0:
            parts.append(pattern[start:k])
            start = k + 1
    parts.append(pattern[start:])
    out = []
    for part in parts:
        part = re.sub(r"(?<!\\)\(([^()]*?)(?<!\\)\)", lambda m: m.group(1).replace("|", "/"), part)
        text = re.sub(r"\\d\+", "N", part).replace(".*", " ... ").replace("[sz]", "s")
        text = re.sub(r"\\(.)", r"\1", text)
        out.append(re.sub(r"\s+", " ", text).strip())
    return out


def exception_entries(student_files: list[str]) -> list[str]:
    """One FAQ entry per exception hint that applies to ``student_files`` (kit-relative paths of the course)."""
    entries = []
    for prefix, pattern, hint in error_words.EXCEPTION_HINTS:
        if prefix and not any(rel.startswith(prefix) for rel in student_files):
            continue
        where = f" in `{prefix}`" if prefix else ""
        shapes = " or ".join(f"`{s}`" for s in readable(pattern.pattern))
        entries.append(f"**An error{where} like {shapes}.** The grader adds: \"likely cause: {hint}\".")
    return entries


def closure_entry(path: str) -> str:
    """The entry for ``static_hints``: what the grader prints before running a late-binding closure in ``path``."""
    found = static_hints(_CLOSURE_EXAMPLE, 10, path)
    example = "\n".join("    " + line for line in _CLOSURE_EXAMPLE.splitlines())
    return ("**A failure that names \"a late-binding closure\".** The grader reads your region before it runs "
            "it; a function defined in a loop that reads the loop variable when it runs (not when it was "
            f"made) is flagged. For a region of `{path}` whose body starts at line 10 with\n\n{example}\n\n"
            "it prints\n\n    " + "\n    ".join(found))


def render(sub_problems: list[str], student_files: list[str]) -> str:
    """The FAQ for a course with ``sub_problems`` ("1.1", ...) and ``student_files``: common entries, the
    generated ones, then the hand-written entries of each chosen sub-problem, in rubric order."""
    found = sections()
    example = "pipeline/pipe.py" if "pipeline/pipe.py" in student_files else student_files[0]
    parts = [found.get("common", ""), *exception_entries(student_files), closure_entry(example)]
    for sub in sub_problems:
        if sub in found:
            parts.append(f"*Problem {sub}:*\n\n" + found[sub])
    return "\n\n".join(p for p in parts if p)
