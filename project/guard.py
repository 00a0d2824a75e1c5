"""Divergence guard: refuse a step whose loss is not finite or spikes above the recent median.

    loss_t not finite                       -> diverged
    loss_t > factor * median(last W losses)  -> diverged   (after MIN_HISTORY accepted steps)

A diverged step is not applied: the runner drops its gradients and rolls
back to the newest checkpoint written before the update that produced the
bad loss (``rollback_target``), or only skips the step when there is none.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

WINDOW = 20        # accepted losses the median is taken over
MIN_HISTORY = 5    # accepted steps before spikes are judged (the first losses fall fast)


class DivergenceGuard:
    """Judges each optimizer step's loss; ``factor <= 0`` turns the spike test off (non-finite is always caught)."""

    def __init__(self, factor: float = 2.0, window: int = WINDOW):
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, loss: float) -> str | None:
        """Return why the step must not be applied, or None (and remember ``loss``) when it is fine."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if self.factor > 0 and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                return f"loss {loss:.4g} > {self.factor:g} x recent median {median:.4g}"
        self.recent.append(loss)
        return None

    def reset(self, losses: list[float]) -> None:
        """Forget the history and start again from ``losses`` (those of the checkpoint rolled back to)."""
        self.recent.clear()
        self.recent.extend(losses[-(self.recent.maxlen or 0):])


def rollback_target(saved_steps: list[int], bad_step: int) -> int | None:
    """The newest checkpoint step older than the update that produced ``bad_step``'s loss (``< bad_step - 1``).

    The loss of step t is computed with the weights after update t - 1, so
    the checkpoint of step t - 1 already holds the suspect update. None when
    no checkpoint is old enough.
    """
    older = [s for s in saved_steps if s < bad_step - 1]
    return max(older) if older else None
