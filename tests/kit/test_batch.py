"""``python -m grading batch``: many submissions, good and bad, one CSV row each; none stops the batch."""
import csv
import json
import zipfile
from pathlib import Path

import pytest

from grading.__main__ import main as grading_main
from grading.commands import batch
from grading.kit.regions import parse_regions, replace_bodies, stub_body
from tests.kit.variants import KIT_ROOT, make_variant_kit

pytestmark = pytest.mark.kit
DATASET = "data_parallel/dataset.py"


def _starter_text(rel: str) -> str:
    text = (KIT_ROOT / rel).read_text()
    return replace_bodies(text, rel, {k: stub_body(r) for k, r in enumerate(parse_regions(text, rel))})


def _folder(root, text: str):
    (root / "data_parallel").mkdir(parents=True)
    (root / DATASET).write_text(text)


def test_batch_grades_everything_and_survives_bad_submissions(tmp_path):
    subs = tmp_path / "submissions"
    _folder(subs / "alice", (KIT_ROOT / DATASET).read_text())                 # reference: full marks
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:                         # starter, wrapped in a folder
        z.writestr(f"a5/{DATASET}", _starter_text(DATASET))
    with zipfile.ZipFile(subs / "carol.zip", "w") as z:                       # zip slip: rejected
        z.writestr("../../escape.py", "x = 1")
    hang = make_variant_kit(tmp_path / "k1", [(DATASET, "partition_indices",
                                               "import time\nwhile True:\n    time.sleep(0.1)\n")])
    _folder(subs / "dave", (hang / DATASET).read_text())                      # hangs: cut off per case
    seen_tmp = tmp_path / "eve's temporary folder.txt"
    kill_my_grader = ("import os, signal, tempfile\n"
                      f"open({str(seen_tmp)!r}, 'a').write(tempfile.gettempdir() + '\\n')\n"
                      "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                      "    try:\n        line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
                      "    except OSError:\n        continue\n"
                      "    if b'\\x00grade\\x00' in line and b'/submissions/eve\\x00' in line:\n"
                      "        os.kill(int(pid), signal.SIGKILL)\n")   # its own grader, by command line
    killer = make_variant_kit(tmp_path / "k2", [(DATASET, "partition_indices", kill_my_grader)])
    _folder(subs / "eve", (killer / DATASET).read_text())                     # kills its own grader
    parent_killer = make_variant_kit(tmp_path / "k3", [(DATASET, "partition_indices",
                                                        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")])
    _folder(subs / "frank", (parent_killer / DATASET).read_text())            # kills its parent: the fork server
    (subs / ".DS_Store").write_text("ignored")
    out = tmp_path / "grades.csv"
    code = grading_main(["batch", str(subs), "--out", str(out), "--jobs", "2", "--problem", "1.1", "--timeout", "6",
                         "--quiet"])
    assert code == 0
    rows = {row["submission"]: row for row in csv.DictReader(out.open())}
    assert list(rows) == ["alice", "bob.zip", "carol.zip", "dave", "eve", "frank"]
    expected = {"alice": ("passed", "13"), "bob.zip": ("incomplete", "0"), "carol.zip": ("rejected", "0"),
                "dave": ("failed", "0"), "eve": ("grader_error", "0"), "frank": ("failed", "0")}
    assert {name: (row["status"], row["score"]) for name, row in rows.items()} == expected, rows
    assert rows["alice"]["problem_1.1"] == "13" and rows["alice"]["max_score"] == "13"
    assert "unsafe path" in rows["carol.zip"]["notes"]
    assert "did not finish" in rows["eve"]["notes"]
    # eve's grader and ranks had a temporary folder of their own (the grader's kit copy and runs went there),
    # and it is gone although the grader was killed before it could clean up
    eve_tmp = {Path(line) for line in seen_tmp.read_text().splitlines() if line}     # one line a rank
    assert len(eve_tmp) == 1 and all(p.name.startswith(batch.SCRATCH_PREFIX) and not p.exists() for p in eve_tmp), \
        eve_tmp
    # the rank's parent is its fork server: killing it voids the whole run (whatever its ranks recorded before
    # they died with the server would depend on timing), and the grader goes on with a fresh server
    frank = json.loads((tmp_path / "grades_results" / "frank" / "results.json").read_text())
    assert all("killed the process that started it" in t["output"] for t in frank["tests"]), frank
    for name in rows:
        results = json.loads((tmp_path / "grades_results" / name / "results.json").read_text())
        assert "tests" in results and "score" in results
    dave = json.loads((tmp_path / "grades_results" / "dave" / "results.json").read_text())
    assert all("timed out after" in t["output"] for t in dave["tests"]), dave
    # one column per criterion (empty where nothing was graded), and the class report next to the CSV
    assert rows["alice"]["1.1.coverage"] == "2" and rows["bob.zip"]["1.1.coverage"] == "0"
    assert rows["carol.zip"]["1.1.coverage"] == "" and rows["eve"]["1.1.coverage"] == ""
    report = list(csv.DictReader((tmp_path / "grades_class_report.csv").open()))
    assert {r["criterion"] for r in report} == {k for k in rows["alice"] if k.startswith("1.1.")}
    assert all(r["graded"] == "4" for r in report)                             # alice, bob.zip, dave, frank
    page = (tmp_path / "grades_class_report.html").read_text()
    assert "carol.zip (rejected)" in page and "eve (grader_error)" in page
