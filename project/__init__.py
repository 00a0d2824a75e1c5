"""Entry points of the kit (``run_*.py``, ``plot.py``) and the library they share.

Entry points are thin: parse (``cli``), check readiness (``readiness``), then
call the library: ``data`` and ``model`` (what to train), ``devices`` (where),
``loop`` (how: accumulation, ``precision``, ``checkpoint``, ``guard``,
``metrics``), ``train_lib`` (shared arguments, loss, evaluation, launch).
"""
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent   # the kit (or student starter) this package belongs to
