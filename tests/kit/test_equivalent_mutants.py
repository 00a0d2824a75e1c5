"""Every listed equivalent mutant is proven by a witness (docs/mutation-analysis.md, "Equivalent mutants").

Each entry of a ``grading/problems/*/equivalent_mutants.json`` has a witness in
``tests/kit/equivalent_witnesses.py``, keyed by its mutant id: the reference and the mutant (``Mutant.text``
loaded as a module) run on inputs at the boundary of the entry's reason and must be found equal there. An entry
without a witness fails, naming it; so does a witness whose entry is no longer listed. The witnesses that need
``torch.distributed`` run in one 2-rank gloo group started once (``project.launch.spawn_ranks``), while the
others run in this process.
"""
from __future__ import annotations

import pytest

from common import ROOT
from grading.commands.mutants import listed_equivalents
from grading.kit.mutations import mutants_of
from grading.kit.splice import kit_text
from grading.problems import titles
from tests.kit.equivalent_witnesses import (DISTRIBUTED, WITNESS_FAILED, WITNESSES, first_difference, observe_pairs,
                                           rank_main)

pytestmark = pytest.mark.kit
LISTED = {e.mutant: e for problem in titles() for e in listed_equivalents(problem)}
HOW = ("add one to WITNESSES in tests/kit/equivalent_witnesses.py: inputs at the boundary of its reason "
       "(docs/mutation-analysis.md, Equivalent mutants)")
RANKS_LIMIT_S = 120.0


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The two ranks of the distributed witnesses, started first: they import torch and join their group while
    this process makes the mutants (``jobs``), and run while it runs the other witnesses (forked by this process's
    rank server, ``project.rank_start``)."""
    from project.launch import file_rendezvous, spawn_ranks
    folder = tmp_path_factory.mktemp("witness_ranks")
    handle = spawn_ranks(rank_main, DISTRIBUTED, file_rendezvous(folder, "store"), (str(folder),),
                         name="witness rank")
    yield handle
    handle.close(grace_s=5.0, stop=True)


@pytest.fixture(scope="module")
def jobs(ranks) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """``(id, path, mutant text)`` of every listed mutant that has a witness, and the reference text of each file;
    the distributed ones are sent to the ranks."""
    problems = tuple(sorted({mutant.split("/")[0] for mutant in LISTED}))
    found = [m for m in mutants_of(ROOT, problems) if m.id in LISTED and m.id in WITNESSES]
    every = [(m.id, m.path, m.text(ROOT)) for m in found]
    references = {m.path: kit_text(ROOT, m.path) for m in found}
    distributed = [job for job in every if WITNESSES[job[0]].world]
    ranks.send((distributed, {path: references[path] for _, path, _ in distributed}))
    return every, references


@pytest.fixture(scope="module")
def rank_pairs(ranks) -> list[dict]:
    """Per rank: ``{id: (reference's observation, mutant's)}`` of the distributed witnesses."""
    return ranks.wait(RANKS_LIMIT_S)


@pytest.fixture(scope="module")
def local_pairs(jobs, tmp_path_factory) -> dict:
    """``{id: (reference's observation, mutant's)}`` of the witnesses that run in this process."""
    return observe_pairs(jobs[0], jobs[1], 0, tmp_path_factory.mktemp("witness_local"))


def test_every_witness_names_a_listed_equivalent():
    unlisted = sorted(set(WITNESSES) - set(LISTED))
    assert not unlisted, (f"witnesses of mutants that no equivalent_mutants.json lists (killed now, or renamed): "
                          f"{unlisted}; remove them from WITNESSES in tests/kit/equivalent_witnesses.py")


@pytest.mark.parametrize("entry", sorted(LISTED))
def test_the_listed_mutant_behaves_as_the_reference_at_its_boundary(entry, jobs, request):
    listed, witness = LISTED[entry], WITNESSES.get(entry)
    if witness is None:
        pytest.fail(f"{entry} is listed as equivalent ({listed.reason}) but has no witness; {HOW}")
    if entry not in {job[0] for job in jobs[0]}:
        pytest.fail(f"{entry}: the kit has no such mutant any more (tests/kit/test_mutants.py says more)")
    if witness.world:
        places = [(f"on rank {r}", pairs[entry]) for r, pairs in enumerate(request.getfixturevalue("rank_pairs"))
                  if entry in pairs]
        assert places, f"{entry}: no rank ran its witness"
    else:
        places = [("in this process", request.getfixturevalue("local_pairs")[entry])]
    for where, (reference, mutant) in places:
        broken = isinstance(reference, tuple) and reference[0] == WITNESS_FAILED
        assert not broken, f"{entry}: witness {witness.observe.__name__} fails {where} on the reference:\n{reference}"
        assert reference == mutant, (
            f"{entry} is not equivalent: {where}, {witness.observe.__name__} tells it from the reference "
            f"{first_difference(reference, mutant)}. The reason listed, \"{listed.reason}\", does not hold for an "
            f"input the docstring allows: make it a check (a criterion or a stronger input), or state the "
            f"assumption in the docstring")
