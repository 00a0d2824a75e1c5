"""Correct solutions of Problems 1-3 other than the reference, as region bodies to splice into a copy of the kit.

``IMPLEMENTATIONS`` maps a name to its edits, ``(path, function, body)`` as ``grading.commands.variants`` takes them:
- ``docstring_only``: written from the docstrings alone, without reading the reference's regions;
- ``rng_order``: the reference with the choices the docstrings leave open made otherwise (LoRA adapters drawn
  in another order, gradients all-reduced in another order, stages built in another order).
``tests/test_reference_numbers.py`` runs the entry points on them to check that the numbers the handout states
hold for correct code in general, not for the reference alone.
"""
from __future__ import annotations

from tests.independent_solutions import docstring_only, rng_order

IMPLEMENTATIONS: dict[str, list[tuple[str, str, str]]] = {
    "docstring_only": docstring_only.EDITS,
    "rng_order": rng_order.EDITS,
}
