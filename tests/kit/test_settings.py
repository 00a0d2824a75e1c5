"""Every environment variable the kit reads is declared once, in ``common/settings.py`` (issue 63).

``docs/settings.md`` is generated from it; no other module of ``project/``, ``grading/``, ``common/`` or
``scripts/`` spells a ``GRADING_*``/``KIT_*`` name (they use the constants); a bad value is refused with one line
naming the variable; and a few settings are shown to do what the table says, without a grading run.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import fields

import pytest

from common import ROOT
from common.settings import (FORKSERVER_ENV, HAND_OVER, PROBLEMS_ENV, SECRET_ENV, THREADS_ENV, USER_ENV, Settings,
                             fresh, settings)
from grading.commands.settings_page import HAND_OVER_DOCS, settings_markdown
from grading.__main__ import main
from grading.sandbox import isolation
from grading.sandbox.limits import default_limits
from grading.engine.runner import warm_servers
from grading.kit.course import chosen_problems

pytestmark = pytest.mark.kit

KIT_NAME = re.compile(r"(GRADING|KIT)_[A-Z0-9_]+")
SEARCHED = ("project", "grading", "common", "scripts")


def test_docs_settings_md_is_generated_from_the_dataclass():
    assert (ROOT / "docs" / "settings.md").read_text() == settings_markdown(), \
        "docs/settings.md is out of date: python -m grading docs"
    assert set(HAND_OVER_DOCS) == set(HAND_OVER), "every hand-over name documented once"


def test_every_setting_has_one_variable_and_a_meaning():
    names = [each.metadata["env"] for each in fields(Settings)]
    assert all(KIT_NAME.fullmatch(name) for name in [*names, *HAND_OVER, SECRET_ENV]), names
    assert len(set([*names, *HAND_OVER, SECRET_ENV])) == len(names) + len(HAND_OVER) + 1, "a name declared twice"
    assert all(len(each.metadata["doc"]) > 20 for each in fields(Settings))


def test_no_module_spells_a_kit_variable_outside_common_settings():
    """Only the constants of ``common.settings`` (and the staff page's table of the shell scripts' own variables)
    name a variable: a string that is a ``GRADING_*``/``KIT_*`` name anywhere else is a second declaration
    (docstrings and messages that mention one are fine)."""
    found = []
    for package in SEARCHED:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("common/settings.py", "grading/commands/settings_page.py") or "pristine" in path.parts:
                continue
            found += [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and KIT_NAME.fullmatch(node.value)]
    assert not found, "name these through common.settings' constants:\n" + "\n".join(found)


@pytest.mark.parametrize("name, value", [("GRADING_MEMORY_MB", "lots"), ("GRADING_FORKSERVERS", "3"),
                                         ("GRADING_SANDBOX", "yes"), ("GRADING_THREADS", "0"),
                                         ("KIT_RANK_START", "fork")])
def test_a_bad_value_is_refused_in_one_line_naming_the_variable(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as refused:
        settings()
    message = str(refused.value)
    assert message.startswith(f"{name} must be ") and message.endswith(f"not {value!r}") and "\n" not in message
    assert main(["list"]) == 2                               # the command line says it before any work
    assert capsys.readouterr().err == f"error: {message}\n"


def test_settings_follow_the_environment_and_keep_no_secret(monkeypatch):
    monkeypatch.delenv(FORKSERVER_ENV, raising=False)
    assert settings() is settings() and settings().fork_server
    monkeypatch.setenv(FORKSERVER_ENV, "0")                  # changed on purpose: seen at the next call
    assert not settings().fork_server and fresh() == settings()
    monkeypatch.setenv("GRADING_HIDE", os.pathsep.join(["/srv/keys", "", "/etc/private"]))
    assert settings().hide == ("/srv/keys", "/etc/private")
    monkeypatch.setenv(SECRET_ENV, "this term's secret")
    assert "this term's secret" not in repr(settings())


def test_the_limits_follow_the_sandbox_settings(monkeypatch):
    monkeypatch.setenv("GRADING_FILE_MB", "8")
    monkeypatch.setenv("GRADING_MEMORY_MB", "0")
    monkeypatch.setenv("GRADING_NETWORK", "1")
    limits = default_limits(10.0)
    assert (limits.file_mb, limits.memory_mb, limits.open_files, limits.network) == (8, None, 4096, True)
    monkeypatch.setenv("GRADING_SANDBOX", "0")
    off = default_limits(10.0)
    assert (off.memory_mb, off.cpu_s, off.open_files, off.file_mb) == (None, None, None, None)


def test_problems_fork_servers_and_rank_user_do_what_they_say(monkeypatch):
    monkeypatch.setenv(PROBLEMS_ENV, "1,4")
    assert chosen_problems() == ("1", "4")
    monkeypatch.setenv(FORKSERVER_ENV, "0")
    assert warm_servers(ROOT) is None                    # cold ranks: no fork server is made
    monkeypatch.setenv(USER_ENV, "-")
    if os.geteuid() == 0:
        assert isolation.rank_user() == (None, f"{USER_ENV} asks to stay root")
    kept = isolation.rank_environment({THREADS_ENV: "2", PROBLEMS_ENV: "1,4", SECRET_ENV: "s", "GRADING_HIDE": "/x"})
    assert kept == {THREADS_ENV: "2", PROBLEMS_ENV: "1,4"}, "a rank gets its threads and problems, not the secret"
