"""Fault injection on the checkpoint store itself (issue 24): real files, real torch.save, one process.

Each damage a disk or a user can do (a truncated file, one flipped byte, a
missing file, a missing or dangling ``latest``, a full disk during a save)
must end in one line that names the step, the file and expected vs found,
and leave a state ``--resume`` accepts. The runs end to end (a real SIGKILL,
RLIMIT_FSIZE, 2 ranks) are in ``test_faults_runs.py``.
"""
from __future__ import annotations

import errno
import json

import pytest
import torch

from common.files import read_json, read_jsonl
from project import checkpoint, resume
from project.cli import ConfigError
from project.bench.report import read_runs
from project.output import StepLog, read_steps

pytestmark = pytest.mark.project


def _save(root, step, keep=3):
    state = {"model": {"w": torch.full((256,), float(step))}, "position": {"step": step}}
    checkpoint.save(root, step, 0, state, {"rng": torch.get_rng_state()}, lambda: None,
                    meta={"step": step}, keep=keep)


@pytest.fixture
def root(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path / "ckpt", step)
    return tmp_path / "ckpt"


def _resolve(path) -> tuple[str, list[str]]:
    said: list[str] = []
    return resume.resolve(path, say=said.append).name, said


def test_fault_intact_checkpoints_resolve_to_latest_silently(root):
    assert (root / "latest").read_text().strip() == "step_00000006"
    assert json.loads((root / "step_00000006" / "manifest.json").read_text())["step"] == 6
    assert _resolve(root) == ("step_00000006", [])
    assert resume.resolve(root / "step_00000004").name == "step_00000004"


def test_fault_truncated_file_falls_back_with_one_line_and_refuses_the_explicit_step(root):
    state = root / "step_00000006" / "state.pt"
    size = state.stat().st_size
    state.write_bytes(state.read_bytes()[:1000])
    name, said = _resolve(root)
    assert name == "step_00000004"
    assert said == [f"--resume {root}: skipped step_00000006 (state.pt has 1,000 bytes, the manifest says "
                    f"{size:,}); resuming from step_00000004"]
    with pytest.raises(ConfigError, match=r"step_00000006 is damaged: state.pt has 1,000 bytes, the manifest says"):
        resume.resolve(root / "step_00000006")


def test_fault_one_flipped_byte_is_found_by_its_sha256(root):
    state = root / "step_00000006" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    name, said = _resolve(root)
    assert name == "step_00000004"
    assert "state.pt has sha256" in said[0] and "(same size)" in said[0]


def test_fault_missing_file_and_two_damaged_steps_are_each_named(root):
    (root / "step_00000006" / "rng_rank0.pt").unlink()
    (root / "step_00000004" / "manifest.json").unlink()
    name, said = _resolve(root)
    assert name == "step_00000002"
    assert said[0].startswith(f"--resume {root}: skipped step_00000006 (rng_rank0.pt is missing (the manifest says")
    assert "skipped step_00000004 (manifest.json is missing (its save never finished))" in said[1]


@pytest.mark.parametrize("latest", [None, "step_00000099", "garbage\x00"])
def test_fault_missing_or_dangling_latest_falls_back_to_the_newest_intact_step(root, latest):
    if latest is None:
        (root / "latest").unlink()
    else:
        (root / "latest").write_text(latest)
    name, said = _resolve(root)
    assert name == "step_00000006"
    assert len(said) == 1 and "skipped 'latest' (" in said[0] and said[0].endswith("resuming from step_00000006")


def test_fault_nothing_intact_is_refused_in_one_line(root):
    for step in (2, 4, 6):
        (root / f"step_{step:08d}" / "state.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="no intact checkpoint: step_00000006 .*step_00000004 .*step_00000002"):
        resume.resolve(root)


def test_fault_keep_last_prunes_after_a_save_and_never_the_new_one(tmp_path):
    root = tmp_path / "ckpt"
    for step in range(1, 6):
        _save(root, step, keep=2)
    assert [s for s, _ in checkpoint.checkpoints(root)] == [4, 5]
    _save(root, 6, keep=1)
    assert [s for s, _ in checkpoint.checkpoints(root)] == [6]
    assert _resolve(root) == ("step_00000006", [])


def test_fault_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(root, monkeypatch):
    real_save = torch.save

    def half_then_full(obj, handle, *args, **kwargs):   # what a disk that fills up mid-file does
        real_save(obj, handle, *args, **kwargs)
        handle.truncate(handle.tell() // 2)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_full)
    with pytest.raises(checkpoint.SaveError) as caught:
        _save(root, 8)
    assert str(caught.value) == (f"cannot write checkpoint step_00000008: No space left on device (step_00000006 and "
                                 f"'latest' are intact: resume with --resume {root})")
    monkeypatch.undo()
    assert not (root / "step_00000008.tmp").exists() and not (root / "step_00000008").exists()
    assert _resolve(root) == ("step_00000006", [])
    _save(root, 8)                                    # space again: the same step saves normally
    assert _resolve(root) == ("step_00000008", [])


def test_fault_a_rank_whose_folder_another_rank_removed_lets_that_rank_report_first(root, monkeypatch):
    """Two ranks, one staging folder: rank 0's write fails and removes it, so rank 1's write fails with ENOENT.
    Rank 1 waits before reporting (the launcher takes the first error, which must be rank 0's cause)."""
    waits = []
    monkeypatch.setattr(checkpoint.time, "sleep", waits.append)
    for folder_left, waited in ((False, [checkpoint.SECONDARY_FAILURE_WAIT_S]), (True, [])):
        waits.clear()
        (root / "step_00000008.tmp").mkdir(exist_ok=True)
        with pytest.raises(checkpoint.SaveError, match="No such file or directory"):
            with checkpoint.failure_is_one_line(root, 8):
                if not folder_left:
                    (root / "step_00000008.tmp").rmdir()          # what rank 0's failure did meanwhile
                open(root / "step_00000008.tmp" / "missing" / "rng_rank1.pt", "wb")
        assert waits == waited
        assert not (root / "step_00000008.tmp").exists()


def test_fault_a_save_killed_midway_leaves_a_folder_the_next_save_replaces(root):
    stale = root / "step_00000008.tmp"
    stale.mkdir()
    (stale / "rng_rank1.pt").write_bytes(b"from a run killed midway")
    assert _resolve(root) == ("step_00000006", [])
    _save(root, 8)
    files = json.loads((root / "step_00000008" / "manifest.json").read_text())["files"]
    assert "rng_rank1.pt" not in files and not stale.exists()


def test_fault_torn_jsonl_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    records, warnings = read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2]
    assert warnings == [f"{path}: line 2 is not JSON (damaged); skipped it, read the rest",
                        f"{path}: line 4 is torn (the run stopped while writing it); skipped it, read the rest"]
    said: list[str] = []
    assert [s["step"] for s in read_steps(path, said.append)[0]] == [1, 2] and len(said) == 2
    assert [r["step"] for r in read_runs(path, said.append)] == [1, 2] and len(said) == 4   # the benchmark's reader
    StepLog(tmp_path, resume_step=1)                 # a resumed run keeps the good lines up to its step
    assert read_jsonl(path) == ([{"step": 1, "loss": 2.0}], [])
    assert read_json(tmp_path / "missing.json")[0] is None
    (tmp_path / "torn.json").write_text('{"a": ')
    assert read_json(tmp_path / "torn.json")[1].startswith(f"{tmp_path / 'torn.json'}: not valid JSON")
