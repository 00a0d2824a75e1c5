"""How a warm rank starts, the same for the grader's ranks and the entry points' ranks.

Both fork their ranks from a process that imported the heavy libraries once (``common.forkserver``,
``multiprocessing``'s fork server in ``project.rank_start``). Here: the library modules worth importing there
(each tuple importable without starting a thread under ``OMP_NUM_THREADS=1``, so not ``datasets``: pyarrow
starts one), ``adopt_environment``, by which a forked rank takes its launcher's environment of now, and how often
the processes that import those libraries collect cyclic garbage (``collect_less``).
"""
from __future__ import annotations

import gc
import os
import tempfile
from typing import Mapping

SERVER_IMPORTS = ("torch", "torch.distributed")                   # every fork server, before its first fork
OPTIMIZER_IMPORTS = ("torch._dynamo",)                           # a process's first torch.optim optimizer imports it
GRADIENT_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)   # a first backward(gradient) imports it (sympy)
GPT2_IMPORTS = (*OPTIMIZER_IMPORTS, "transformers.models.gpt2.modeling_gpt2")
GRADE_IMPORTS = GPT2_IMPORTS        # a grade's own judging: its references run torch.optim and build GPT-2
DEEPSPEED_IMPORTS = (*OPTIMIZER_IMPORTS, "deepspeed",
                     "deepspeed.runtime.zero.muon.muon_optimizer",   # deepspeed.initialize: torch.compile's imports
                     "torch.utils.cpp_extension", "torch._inductor.codegen.cpp")

PYTHON_GC_THRESHOLDS = gc.get_threshold()      # this interpreter's own, as it started
FEWER_COLLECTIONS = (50_000, 20, 10)           # a young collection per 50,000 new container objects


def collect_less() -> None:
    """Have this process collect cyclic garbage less often (``FEWER_COLLECTIONS``; ``gc.set_threshold``), so that
    importing the heavy libraries does not re-walk the growing heap each time it grows by a quarter (Python's
    rule for a full collection under its default thresholds). For processes that hold no large data in
    reference cycles: the fork servers, the grader's own processes, the test suite's workers; never a rank
    (``collect_as_python_does``) or a training entry point, whose cycles may hold tensors.
    """
    gc.set_threshold(*FEWER_COLLECTIONS)


def collect_as_python_does() -> None:
    """Give this process the interpreter's own collection thresholds back (``PYTHON_GC_THRESHOLDS``): a rank
    forked from a fork server collects as a fresh interpreter does."""
    gc.set_threshold(*PYTHON_GC_THRESHOLDS)


def adopt_environment(env: Mapping[str, str]) -> None:
    """Make ``env`` this (forked) process's whole environment, as if the interpreter had started with it.

    ``os.environ`` holds exactly ``env`` afterwards, and ``tempfile`` looks
    its folder up again (``TMPDIR``, ...) on its next use: the standard library
    reads it once and keeps it (importing torch asks for it), so a rank given
    another ``TMPDIR`` (a batch gives each grade its own) would otherwise still
    write to its server's.
    """
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
