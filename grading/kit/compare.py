"""Tensor comparisons for criteria (used by the checks, never by the engine): each fails with a message naming the
quantity, rank and max abs diff."""
from __future__ import annotations

from typing import Any

import torch

from grading.engine.expect import CheckFailed


def describe(value: Any) -> str:
    """A short description of ``value`` for messages (type, shape, dtype, device)."""
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).replace('torch.', '')} on {value.device}"
    return type(value).__name__


def describe_kind(value: Any) -> str:
    """``describe``, and for a non-empty list or tuple also the kinds it holds (recursively, each kind once):
    ``'list of tuple of int'``, ``'list of tensor(2,) float32 on cpu'``. For messages naming what came back."""
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {', '.join(sorted({describe_kind(item) for item in value}))}"
    return describe(value)


def assert_tensor_close(what: str, actual: Any, expected: torch.Tensor, *, atol: float = 1e-6,
                        rtol: float = 1e-5) -> None:
    """Raise CheckFailed unless ``actual`` is a tensor like ``expected`` (shape, dtype) and close to it.

    ``what`` names the quantity, e.g. "rank 1 grad of 'fc1.weight'". NaN or Inf in
    ``actual`` fails. The comparison runs on CPU in float64.
    """
    if not isinstance(actual, torch.Tensor):
        raise CheckFailed(f"{what}: expected a tensor, got {describe(actual)}")
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    if actual.device.type == "meta":
        raise CheckFailed(f"{what}: a tensor on the meta device (no data), expected values on {expected.device}")
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    if not torch.isfinite(a).all():
        raise CheckFailed(f"{what}: contains NaN or Inf")
    diff = (a - e).abs()
    limit = atol + rtol * e.abs()
    if (diff > limit).any():
        raise CheckFailed(f"{what}: differs from the reference by {diff.max().item():.3g} "
                          f"(tolerance {atol:g} + {rtol:g}·|ref|)")


def assert_state_close(what: str, actual: Any, expected: dict[str, torch.Tensor | None], **tol) -> None:
    """Compare dicts of name -> tensor (or None) key by key with ``assert_tensor_close``.

    A failure names the first mismatching entry with its difference, then on the same line every mismatching name,
    and, where the mismatches form a pattern (only the biases, only the weights), a ``pattern:`` line.
    """
    if not isinstance(actual, dict):
        raise CheckFailed(f"{what}: expected a dict of tensors, got {describe(actual)}")
    missing = sorted(set(expected) - set(actual))
    if missing:
        raise CheckFailed(f"{what}: missing entries {missing}")
    compared = [name for name, ref in expected.items() if ref is not None]
    failures = {}
    for name in compared:
        try:
            assert_tensor_close(f"{what} '{name}'", actual[name], expected[name], **tol)
        except CheckFailed as failure:
            failures[name] = str(failure)
    if failures:
        raise CheckFailed(next(iter(failures.values())) + mismatch_lines(list(failures), compared))


def mismatch_lines(bad: list[str], compared: list[str], shown: int = 8) -> str:
    """What follows the first mismatch's text when the ``bad`` of the ``compared`` names differ: every mismatching
    name, on the same line (at most ``shown``, then a count), and a line with the pattern they form, if any ('' when
    only one name was compared)."""
    if len(compared) < 2:
        return ""
    names = ", ".join(bad[:shown]) + (f" and {len(bad) - shown} more" if len(bad) > shown else "")
    lines = f"; {len(bad)} of {len(compared)} entries differ: {names}"
    biases = {name for name in compared if name.rsplit(".", 1)[-1] == "bias"}
    if biases and biases != set(compared):
        if set(bad) == biases:
            lines += "\npattern: only the biases differ (every other entry matches)"
        elif set(bad) == set(compared) - biases:
            lines += "\npattern: every entry but the biases differs (the biases match)"
    return lines


def assert_ranks_close(what: str, per_rank: list, expected: dict[str, torch.Tensor | None], hint=None,
                       **tol) -> None:
    """``assert_state_close`` of each rank's state (``per_rank[r]``, labelled ``what.format(rank=r)``) against the
    same ``expected``; a failure reports the first mismatching rank, ``hint(state)`` (a likely-cause text or '')
    when given, and a ``pattern:`` line when only some ranks differ."""
    failures = {}
    for rank, state in enumerate(per_rank):
        try:
            assert_state_close(what.format(rank=rank), state, expected, **tol)
        except CheckFailed as failure:
            failures[rank] = str(failure) + (hint(state) if hint else "")
    if not failures:
        return
    message = next(iter(failures.values()))
    if len(failures) < len(per_rank):
        matching = [str(r) for r in range(len(per_rank)) if r not in failures]
        message += (f"\npattern: only rank {', '.join(map(str, failures))} differs (rank {', '.join(matching)} "
                    "matches)")
    raise CheckFailed(message)
