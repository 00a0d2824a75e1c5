"""Likely causes for Problem 4 failures, found by recomputing a suspected wrong answer (never a right one)."""
from __future__ import annotations

import torch

from grading.problems.p4_1_ddp import reference as ref
from grading.problems.p4_1_ddp.async_results import unwaited


def close_to(got, expected: dict, atol: float, rtol: float) -> bool:
    """True when ``got`` holds every tensor of ``expected`` with its shape, within the tolerance."""
    return isinstance(got, dict) and all(
        isinstance(got.get(n), torch.Tensor) and got[n].shape == e.shape
        and torch.allclose(got[n].double(), e.double(), atol=atol, rtol=rtol) for n, e in expected.items())


def bucket_hint(got, want: list[list[str]], mb: float) -> str:
    """A likely cause for wrong buckets: registration order, a frozen parameter, a cut at an exact fit."""
    if not (isinstance(got, list) and all(isinstance(b, list) for b in got)):
        return ""
    flat, flat_want = [n for b in got for n in b], [n for b in want for n in b]
    if flat == flat_want[::-1]:
        return ("\nlikely cause: parameters taken in registration order; take them in reverse order of "
                "named_parameters()")
    if "frozen" in flat:
        return "\nlikely cause: a frozen parameter (requires_grad False) was put in a bucket"
    nbytes = {n: p.numel() * p.element_size() for n, p in ref.DDPProbeNet(seed=0).named_parameters()}
    if flat == flat_want and any(sum(nbytes.get(n, 0) for n in b) + nbytes.get(nxt[0], 0) == mb * 2 ** 20
                                 for b, nxt in zip(got, got[1:]) if nxt):
        return ("\nlikely cause: a bucket that reaches the cap exactly was closed; a parameter starts a new bucket "
                "only when the bucket's bytes would then exceed the cap")
    return ""


def early_launch_hint(got, expected: dict, atol: float, rtol: float) -> str:
    """A likely cause when the wrong gradients (name -> tensor) are exactly zero and the others right.

    That is what a bucket all-reduced before all of its gradients arrived leaves: the missing ones went in as
    zeros on every rank. "" when no gradient is right, or a wrong one is not all zeros.
    """
    if not isinstance(got, dict):
        return ""
    wrong, right = 0, 0
    for name, want in ((n, e) for n, e in expected.items() if e is not None):    # None: a frozen parameter
        have = got.get(name)
        if not (isinstance(have, torch.Tensor) and have.shape == want.shape):
            return ""
        if torch.allclose(have.double(), want.double(), atol=atol, rtol=rtol):
            right += 1
        elif torch.count_nonzero(have) == 0 and torch.count_nonzero(want) > 0:
            wrong += 1
        else:
            return ""
    if not (right and wrong):
        return ""
    return ("\nlikely cause: a bucket was all-reduced before all of its gradients arrived (the gradients "
            "that differ are all zero); launch a bucket only when its last gradient is ready")


def unwaited_hint(events: list) -> str:
    """The cause when some async all-reduce of one backward (``DeferredAllReduce``'s events) was never waited on:
    the grader hands a handle's result to its tensor only at ``wait()``, so such a submission is wrong on every
    run, as it would be on any run where gloo had not finished yet. "" when every handle was waited on."""
    missing = unwaited(events)
    if not missing:
        return ""
    launched = sum(1 for e in events if e[0] == "all_reduce" and e[1])
    return (f"\nlikely cause: async all-reduce(s) number {missing} of the {launched} launched were never waited on "
            "(handle.wait()) before finish_gradient_synchronization returned; an async collective's result may "
            "be read only after its handle's wait() (the grader delivers it there, so the values read were this "
            "rank's own)")
