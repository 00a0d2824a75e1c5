"""Problem 3's DeepSpeed ranks build no C++ op: the kit's ``init_engine`` keeps DeepSpeed from JIT-building its CPU
shared-memory all-reduce op (``prepare_deepspeed``).

The variants themselves live in ``grading/problems/p3_*/variants.py`` and are graded by ``tests/kit/test_variants.py``.
"""
import pytest

from grading.kit.variants import assert_verdicts

from grading.commands.variants import declared, grade_group

pytestmark = pytest.mark.kit


def test_deepspeed_ranks_build_no_shm_op(tmp_path, fork_servers):
    # The full-marks variant alone: its ranks run both engines to the end, and only the 3.3 case runs.
    group = tuple(v for v in declared("3.3") if v.name == "zero_settings_added")
    assert_verdicts(grade_group(group, tmp_path, fork_servers), list(group))
    logs = sorted(tmp_path.glob("**/p3_zero_2rank/rank*.stdout"))
    assert logs, "no rank logs of the 3.3 case"
    for log in logs:    # DeepSpeed prints this line after it has built (or loaded) the op
        assert "shm_comm_op built successfully" not in log.read_text(errors="replace"), log
