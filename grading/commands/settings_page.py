"""The staff's page of every environment variable the kit reads (``docs/settings.md``), from ``common.settings``.

``python -m grading docs`` writes it with the clause map; ``tests/kit/test_settings.py`` keeps it equal.
"""
from __future__ import annotations

from dataclasses import fields

from common.settings import (POOL_ENV, RUN_MARKER, SECRET_ENV, SERVER_KIT_ENV, STARTED_ENV, Settings)

HAND_OVER_DOCS = {
    POOL_ENV: "The addresses of fork servers another process keeps (`batch`'s, the test suite's), for a grade to "
              "fork its ranks, and itself, from (`run_servers.ForkServers.pool_env`).",
    SERVER_KIT_ENV: "In a fork server: the folder it was started in, which its children leave off `sys.path`.",
    RUN_MARKER: "Every rank of a case and whatever it starts carry the case's random id; at the case's end each "
                "process that carries it is killed (`sandbox.kill_marked`).",
    STARTED_ENV: "When `python -m grading grade` began (epoch seconds), so `--total-timeout` counts the "
                 "interpreter's start; the grade takes it out of the environment.",
}


# Read only by the shell scripts of the Gradescope bundle (``grading/commands/gradescope.py`` writes them), with
# ``GRADING_FORKSERVERS`` and ``GRADING_PYTHON`` above: name -> (default, meaning).
SCRIPT_VARIABLES = {
    "GRADING_TOTAL_TIMEOUT": ("`gradescope --total_timeout`, 540", "`run_autograder`: the whole grade's limit in "
                              "seconds; Gradescope's own limit must be above it"),
    "GRADING_ARGS": ("none", "`run_autograder`: extra arguments for `grade`, e.g. `--problem 1`"),
    "GRADING_VENV": ("`/autograder/venv`", "`setup.sh`: where the venv goes"),
    "GRADING_VENV_OPTIONS": ("none", "`setup.sh`: options for making the venv, e.g. `--system-site-packages`"),
    "GRADING_TORCH_INDEX": ("the PyTorch CPU index", "`setup.sh`: the index torch comes from"),
    "AUTOGRADER_ROOT": ("`/autograder`", "`run_autograder`: where things are (a kit test runs the bundle in a "
                        "temporary folder laid out like it)"),
    "GRADING_SOURCE": ("`$AUTOGRADER_ROOT/source`", "`run_autograder`: the bundle"),
    "GRADING_SUBMISSION": ("`$AUTOGRADER_ROOT/submission`", "`run_autograder`: the submission"),
    "GRADING_RESULTS": ("`$AUTOGRADER_ROOT/results/results.json`", "`run_autograder`: where the results go"),
}

SECRET_DOC = ("The course secret the hidden inputs are drawn from (`--course-secret S` puts it here); empty: the "
              "bundle's `grading/staff/course_secret.txt`, else the kit's fixed inputs. Never reaches a rank.")


def _shown_default(each) -> str:
    default = int(each.default) if isinstance(each.default, bool) else each.default
    return f"`{default}`" if default not in ("", ()) else "empty"


_KIND = {"bool": "0 or 1", "int": "whole number", "str": "text", "tuple[str, ...]": "paths"}


def settings_markdown() -> str:
    """``docs/settings.md``: the settings (variable, type, default, meaning), the hand-over names, the scripts'."""
    lines = ["# Settings: the environment variables the kit reads", "",
             "Generated from `common/settings.py` (`python -m grading docs`; a kit test keeps the two equal): "
             "edit the dataclass, not this page. Python code reads them through `settings()`, which "
             "parses them once and refuses a bad value with one line naming the variable.", "",
             "## Set by a person", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
    for each in fields(Settings):
        choices = each.metadata["choices"]
        kind = " / ".join(f"`{c}`" for c in choices) if choices else _KIND[each.type]
        lines.append(f"| `{each.metadata['env']}` | {kind} | {_shown_default(each)} | {each.metadata['doc']} |")
    lines += [f"| `{SECRET_ENV}` | text | empty | {SECRET_DOC} |", "",
              "## Read by the Gradescope bundle's scripts", "",
              "`setup.sh` and `run_autograder` ([gradescope.md](gradescope.md)) read these, with `GRADING_PYTHON` "
              "and `GRADING_FORKSERVERS` (`run_autograder` sets 1 unless given) above.", "",
              "| variable | default | what it does |", "|---|---|---|",
              *(f"| `{name}` | {default} | {doc} |" for name, (default, doc) in SCRIPT_VARIABLES.items()), "",
              "## Set by the kit for its own child processes", "",
              "Never set these by hand: the grader sets them for the processes it starts, which read them.", "",
              "| variable | what it carries |", "|---|---|",
              *(f"| `{name}` | {doc} |" for name, doc in HAND_OVER_DOCS.items())]
    return "\n".join(lines) + "\n"
