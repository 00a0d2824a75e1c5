"""The kit's own test run: files with the longest runs are collected first, and one set of zygotes serves the
fork servers of every grading run a test starts.

*Zygotes.* The tests run ``grade``, ``batch`` and nested ``pytest`` dozens of
times, and each run's two fork servers would import torch and the library
preloads again (seconds of CPU each). After collection each test process
starts zygotes (``grading.engine.zygote``) and names them in its environment
(``GRADING_ZYGOTES``), so the runs it starts, in-process or as child processes,
fork their servers from them, as a ``batch`` does. A test that needs cold
servers removes the variable from the environment it passes. Under
``GRADING_FORKSERVER=0`` no zygote is started. Each xdist worker has its
own: ``test_adversarial``'s leak check looks below its process's zygotes, where
another worker's runs would show up as leaks (tried: one set for all workers
made it report, and kill, those runs' servers and ranks). Under xdist the
workers' zygotes are forked from one master set, which the first worker starts
(and stops when it ends; a worker that needs a zygote later and finds no
master starts its own): the imports are paid once, not once per worker.

*Order.*
``pytest -n 2 --dist loadfile`` (the README's test command) hands whole files
to the workers in collection order, a file at a time as a worker frees
up. Collected alphabetically, a long file near the end ran alone at the end
with the other core idle (measured: ~2 min of the run). Longest first, the
short files fill in at the end instead. ``LONGEST_FIRST`` is the order of the
summed test times of a measured run (2 cores, ``--junitxml``); files not listed
follow in their collection order. It changes which test runs when, never what a
test checks. pytest-xdist would sort the files by their number of tests
instead; ``tests/conftest.py`` turns that off (measured: before it did, a
3-test, 40-s file was handed out last and one worker ran alone for the last
26 s). This file is kit-only: a released starter does not ship it.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

from grading import KIT_ROOT
from grading.engine.zygotes import Zygotes
from grading.engine.runner import FORKSERVER_ENV
from grading.engine.zygote import ZYGOTES_ENV

_ZYGOTES: list[Zygotes] = []                      # this process's own
_MASTER: list[tuple[Zygotes, Path]] = []          # the master zygotes, where this worker started them

LONGEST_FIRST = (   # summed test times of a 2-worker run on 2026-12-03, 09:20 (226 s, 413 CPU-s)
    "tests/kit/test_launcher.py", "tests/kit/test_variants_p4.py", "tests/kit/test_adversarial.py",
    "tests/test_project_launch.py", "tests/kit/test_variants_p1.py", "tests/kit/test_variants_p5.py",
    "tests/test_project_runners.py", "tests/kit/test_local_grade.py", "tests/test_faults_runs.py",
    "tests/test_benchmarks.py", "tests/kit/test_batch.py", "tests/test_partial_submission.py",
    "tests/kit/test_zygote.py", "tests/kit/test_answer_key.py", "tests/kit/test_grade_cli.py",
    "tests/kit/test_variants_p2.py", "tests/kit/test_figures.py", "tests/test_training_loop.py",
    "tests/kit/test_slurm.py", "tests/kit/test_gradescope.py", "tests/test_problems.py",
    "tests/test_training_zero.py", "tests/kit/test_exception_locations.py", "tests/test_project_tensor_parallel.py",
    "tests/test_capstone.py", "tests/kit/test_variants_p3.py", "tests/kit/test_adding_a_subproblem.py",
    "tests/test_submission_zip.py", "tests/kit/test_similarity.py", "tests/test_project_gpu_check.py",
    "tests/kit/test_bytecode.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Reorder ``items`` file by file: ``LONGEST_FIRST`` first, in its order; a file's tests keep their order."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    position = {}
    for index, item in enumerate(items):
        position.setdefault(item.nodeid.split("::")[0], index)
    items.sort(key=lambda item: (rank.get(item.nodeid.split("::")[0], len(rank)),
                                 position[item.nodeid.split("::")[0]]))


def _master_folder() -> Path | None:
    """Under xdist: the folder of this test run's master zygotes, started here if no worker has started them."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    record = Path(tempfile.gettempdir()) / f"kit-test-zygotes-{run}"
    with open(record.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists():
            return Path(record.read_text())
        master = Zygotes(KIT_ROOT)
        _MASTER.append((master, record))
        record.write_text(str(master.folder))
        return master.folder


def pytest_collection_finish(session) -> None:
    """Start the session's zygotes and name them in this process's environment (see the module docstring)."""
    if session.config.option.collectonly or os.environ.get(ZYGOTES_ENV) or \
            os.environ.get(FORKSERVER_ENV, "1") == "0":
        return
    zygotes = Zygotes(KIT_ROOT, source=_master_folder())
    _ZYGOTES.append(zygotes)
    os.environ.update(zygotes.env())


def pytest_sessionfinish(session) -> None:
    for zygotes in _ZYGOTES:
        os.environ.pop(ZYGOTES_ENV, None)
        zygotes.close()
    _ZYGOTES.clear()
    for master, record in _MASTER:
        master.close()
        record.unlink(missing_ok=True)
        record.with_suffix(".lock").unlink(missing_ok=True)
    _MASTER.clear()
