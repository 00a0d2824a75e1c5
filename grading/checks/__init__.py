"""Check modules, one per sub-problem, named after the region id they grade.

    p1_1_partition  p1_2_comm                       Problem 1 (data parallel)
    p2_1_schedule   p2_2_pipe   p2_3_gpt2           Problem 2 (pipeline)
    p3_1_lora       p3_2_adapter  p3_3_zero         Problem 3 (LoRA + DeepSpeed ZeRO)
    p4_1_ddp        p4_2_zero1  p4_3_checkpoint     Problem 4 (optional)
    p5_1_layers     p5_2_gpt2                       Problem 5 (optional)

Each holds its probe (run in the rank processes), its ``CASES`` and the
criteria declared next to the functions that judge them. Hidden criteria
are registered by the same modules, only where ``grading.hidden`` exists.
"""
from __future__ import annotations

import importlib
import importlib.util

from grading.engine.rubric import Case, check_rubric, selects

CHECK_MODULES = {
    "1.1": "grading.checks.p1_1_partition",
    "1.2": "grading.checks.p1_2_comm",
    "2.1": "grading.checks.p2_1_schedule",
    "2.2": "grading.checks.p2_2_pipe",
    "2.3": "grading.checks.p2_3_gpt2",
    "3.1": "grading.checks.p3_1_lora",
    "3.2": "grading.checks.p3_2_adapter",
    "3.3": "grading.checks.p3_3_zero",
    "4.1": "grading.checks.p4_1_ddp",
    "4.2": "grading.checks.p4_2_zero1",
    "4.3": "grading.checks.p4_3_checkpoint",
    "5.1": "grading.checks.p5_1_layers",
    "5.2": "grading.checks.p5_2_gpt2",
}
# Staff-only extra cases of optional problems, added where present (grading/hidden is left out of the starter).
HIDDEN_MODULES = {"4": "grading.hidden.p4_hidden", "5": "grading.hidden.p5_hidden"}


def load_cases(problems: tuple[str, ...] | list[str]) -> list[Case]:
    """Every case of the chosen ``problems`` (e.g. ("1", "2", "3")), in rubric order."""
    cases: list[Case] = []
    for sub, name in CHECK_MODULES.items():
        if any(selects(p, sub) for p in problems):
            cases.extend(importlib.import_module(name).CASES)
    for problem, name in HIDDEN_MODULES.items():
        if problem in problems and importlib.util.find_spec("grading.hidden") and importlib.util.find_spec(name):
            cases.extend(importlib.import_module(name).CASES)
    check_rubric(cases)
    return cases
