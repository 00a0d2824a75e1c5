"""The written analysis: its questions (``analysis.md`` next to this file), as a handout section and as the template.

The handout lists the questions of the chosen problems and says how the
course counts them (``release --analysis_points``, recorded in the course
record); ``release`` writes the same questions as the template
``submit_figures/analysis.md`` that the student fills in and the submission
zip carries. Staff read it: the autograder never scores it.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from common.handin import ANALYSIS_NAME, ANSWER_PLACEHOLDER, FIGURES_DIR

QUESTIONS_FILE = Path(__file__).resolve().parent / "analysis.md"
_WIDTH = 110
_TITLED = re.compile(r"\*\*(?P<title>[^*]+?)\.?\*\*\s*(?P<body>.*)", re.DOTALL)


def questions(problems: tuple[str, ...]) -> dict[str, list[str]]:
    """Problem ("1") -> its questions (markdown, one string each), for each of ``problems`` in order.

    Raises ValueError naming a chosen problem without a section, or a section with fewer than 2 questions.
    """
    text = re.sub(r"<!--.*?-->", "", QUESTIONS_FILE.read_text(), flags=re.DOTALL)
    found: dict[str, list[str]] = {}
    for block in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        key, _, body = block.partition("\n")
        items = re.split(r"^- ", body.strip(), flags=re.MULTILINE)
        found[key.strip()] = [re.sub(r"\s*\n\s*", " ", item).strip() for item in items if item.strip()]
    out = {}
    for problem in problems:
        if len(found.get(problem, [])) < 2:
            raise ValueError(f"{QUESTIONS_FILE.name}: Problem {problem} needs a '## {problem}' section with at "
                             "least 2 questions")
        out[problem] = found[problem]
    return out


def points_sentence(points: float) -> str:
    """How the course counts the analysis: graded by the staff for ``points``, or ungraded (0)."""
    if points:
        return (f"It is graded by the course staff (not by the autograder) and worth **{points:g} point"
                f"{'' if points == 1 else 's'}**, on top of the points of the problems.")
    return ("The course has given it no points: it is ungraded unless your staff say so (the autograder never "
            "scores it), but the staff read it next to your figures.")


def section(problems: tuple[str, ...], points: float) -> str:
    """The handout's part: how the course counts it, then per problem an italic title and its numbered questions."""
    parts = [points_sentence(points)]
    for problem, asked in questions(problems).items():
        parts.append(f"*Problem {problem}*\n\n" + "\n".join(f"{k}. {q}" for k, q in enumerate(asked, 1)))
    return "\n\n".join(parts)


def template(problems: tuple[str, ...], points: float) -> str:
    """The text of ``submit_figures/analysis.md`` in the starter: each question with a place for the answer."""
    intro = (f"Answer below each question, from your own measurements (your runs and `{FIGURES_DIR}/`). Keep this "
             f"file at `{FIGURES_DIR}/{ANALYSIS_NAME}`: `bash scripts/create_submission_zip.sh` packages it. "
             + points_sentence(points).replace("**", ""))
    lines = ["# Written analysis", "", textwrap.fill(intro, _WIDTH, break_on_hyphens=False), ""]
    for problem, asked in questions(problems).items():
        lines += [f"## Problem {problem}", ""]
        for k, question in enumerate(asked, 1):
            titled = _TITLED.fullmatch(question)
            title, body = (titled["title"], titled["body"]) if titled else ("", question)
            quoted = textwrap.fill(body, _WIDTH, initial_indent="> ", subsequent_indent="> ", break_on_hyphens=False)
            lines += [f"### Problem {problem}, question {k}" + (f": {title}" if title else ""), "", quoted, "",
                      ANSWER_PLACEHOLDER, ""]
    return "\n".join(lines).rstrip() + "\n"
