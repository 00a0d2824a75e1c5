"""project/bench/publish.py: a benchmark run's results go to the figures folder; what they replace is kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.bench.publish import new_run_folder, publish

pytestmark = pytest.mark.kit

OWNED = ("a.png", "b.png")


def _run(perf: Path, figures: tuple[str, ...], tag: str) -> Path:
    folder = new_run_folder(perf)
    (folder / "summary.json").write_text(json.dumps({"run_folder": str(folder), "command": ["--quick", tag],
                                                     "created": tag}))
    for name in figures:
        (folder / name).write_text(tag)
    return folder


def test_a_new_run_replaces_the_copy_and_the_earlier_run_stays_in_its_own_folder(tmp_path):
    perf, out = tmp_path / "perf", tmp_path / "figures"
    first = _run(perf, OWNED, "first")
    lines = publish(first, out, "summary.json", list(OWNED), OWNED)
    assert lines == [f"this run's summary and figures: {first}/ (copied to {out}/: summary.json, a.png, b.png)"]
    (out / "analysis.md").write_text("my answers")
    second = _run(perf, ("a.png",), "second")
    assert second != first   # same second: another folder
    lines = publish(second, out, "summary.json", ["a.png"], OWNED)
    assert lines[0] == (f"{out}/ held the results of `run_benchmarks.py --quick first` of first: they are kept in "
                        f"{first}/")
    assert (out / "a.png").read_text() == "second" and not (out / "b.png").exists()   # no stale figure
    assert (first / "b.png").read_text() == "first" and (out / "analysis.md").read_text() == "my answers"


def test_results_whose_run_folder_is_gone_are_copied_aside_before_they_are_replaced(tmp_path):
    perf, out = tmp_path / "perf", tmp_path / "figures"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"run_folder": str(tmp_path / "deleted")}))
    (out / "b.png").write_text("old")
    new = _run(perf, ("a.png",), "new")
    lines = publish(new, out, "summary.json", ["a.png"], OWNED)
    kept = [p for p in perf.iterdir() if p.name.startswith("replaced-")]
    assert len(kept) == 1 and (kept[0] / "b.png").read_text() == "old"
    assert json.loads((kept[0] / "summary.json").read_text()) == {"run_folder": str(tmp_path / "deleted")}
    assert f"they are kept in {kept[0]}/" in lines[0] and not (out / "b.png").exists()
