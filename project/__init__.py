"""Entry points of the kit (``run_*.py``, ``plot.py``) and the library they share.

An entry point parses (``cli``, ``options``), checks ``readiness``, freezes its ``config``, then calls ``data`` and
``model`` (what to train), ``devices`` (backend, devices, threads, the group), ``launch`` (starting ranks), ``loop``
(the training loop and its guard; ``updates``, ``zero_engine``, ``precision``; the run state and ``checkpoint`` with its
``manifest``; ``resume``) and ``output`` (what a run prints and writes). No torch is imported before the checks pass:
``cli``, ``options``, ``readiness``, ``output``, ``manifest`` and ``bench.options`` import none at module level.
"""
