"""Entry points of the kit (``run_*.py``, ``plot.py``) and the library they share.

Entry points are thin: parse (``cli``, ``options``), check readiness
(``readiness``), freeze the run's ``config``, then call the library: ``data`` and ``model`` (what to
train, and its loss), ``devices`` (where: backend, rank and stage devices, threads, joining the process group),
``launch`` (starting ranks: the runners and the benchmarks alike), ``loop`` (the one training loop and its
divergence guard, with its strategies in ``updates`` and ``zero_engine``, ``precision``, and the run's state and
``checkpoint`` with its verified ``manifest``; ``resume`` picks one) and
``output`` (progress, log lines, JSON files, ``metrics.jsonl``, the closing report).

That order is also what keeps a refusal fast. ``cli``, ``options``,
``readiness`` and ``bench.options`` (and ``output``,
``manifest``) import no torch, transformers or DeepSpeed at module level,
and neither does an entry point: it imports the library inside the
functions that run after its checks, and its parser reads the choices
owned by modules that do import torch (presets, precisions) with
``cli.read_constant``. So ``--help``, a bad option or an unwritten problem
is one line in a fraction of a second, not after seconds of imports.
"""
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent   # the kit (or student starter) this package belongs to
