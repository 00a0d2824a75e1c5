"""A forked process taking the environment a new interpreter would have started with.

A rank forked by a fork server, a command forked by a zygote and a project
rank forked by ``multiprocessing``'s fork server start with their parent's
``os.environ``, and with what the standard library already read from it: the
temporary folder, which ``tempfile`` reads from ``TMPDIR`` once and keeps
(importing torch asks for it). A child given another ``TMPDIR`` (a batch
gives each grade its own) would still write to the parent's. ``adopt_environment``
replaces both.
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping


def adopt_environment(env: Mapping[str, str]) -> None:
    """Make ``env`` this process's whole environment, as if the interpreter had started with it: ``os.environ``
    holds exactly ``env``, and ``tempfile`` looks its folder up again (``TMPDIR``, ...) on its next use."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
