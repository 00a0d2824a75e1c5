"""The similarity report (grading/commands/similarity.py): planted copies rank first, starter text is ignored,
bad inputs are listed, the CSV and the HTML say what they promise."""
from __future__ import annotations

import ast
import csv
import random
import re
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grading.commands import similarity
from grading.kit.splice import stub_body
from tests.kit.similarity_samples.make import (ROOT, kit_regions, planted_copy, reference_bodies, sample_bodies,
                                               write_submission)
from tests.commands import run_kit_command

HOSTILE = '# </pre><script>alert("x")</script><b>bold</b> & co\n'


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    """ref + its planted copy, three submissions made of independent samples, the starter, and bad inputs."""
    root = tmp_path_factory.mktemp("submissions")
    reference = reference_bodies()
    write_submission(root / "ref", reference)
    rng = random.Random(7)
    copy = {key: planted_copy(body, rng) for key, body in reference.items()}
    write_submission(root / "ref_copy", copy, as_zip=True)
    for name in ("a", "b", "c"):
        bodies = {key: body for per_problem in sample_bodies().values() for key, body in per_problem[name].items()}
        first = sorted(bodies)[0]
        if name == "a":                      # untrusted text must come out escaped
            bodies[first] = HOSTILE + bodies[first]
        write_submission(root / f"sample_{name}", bodies)
    write_submission(root / "starter", {})
    (root / "broken.zip").write_bytes(b"this is not a zip file")
    (root / "no_code").mkdir()
    (root / "no_code" / "notes.txt").write_text("I forgot to include my files\n")
    return root


@pytest.fixture(scope="module")
def report_dir(batch, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    code = similarity.run(batch, out)
    assert code == 0
    return out


def _rows(report_dir: Path) -> list[dict]:
    with open(report_dir / "pairs.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_samples_are_three_independent_solutions_of_every_region_of_their_problem():
    kit_functions: dict[str, set[str]] = {}
    for regions in kit_regions().values():
        for region in regions:
            kit_functions.setdefault(region.id, set()).add(region.function)
    samples = sample_bodies()
    assert {"1.1", "1.2", "2.1", "2.2", "2.3", "3.1", "3.2", "3.3"} <= set(samples)
    for problem, by_name in samples.items():
        assert problem in kit_functions, f"samples for {problem}, which the kit does not have"
        assert len(by_name) >= 3, f"{problem}: only {len(by_name)} samples"
        for name, bodies in by_name.items():
            assert {f for p, f in bodies} == kit_functions[problem], f"{problem}/{name}.py: not every region"


def test_planted_copy_ranks_first_and_independent_solutions_below(report_dir):
    rows = _rows(report_dir)
    problems = {region.id for regions in kit_regions().values() for region in regions}
    samples = sample_bodies()
    for problem in problems:
        ranked = [r for r in rows if r["problem"] == problem]
        assert ranked, f"{problem}: no pairs"
        assert {ranked[0]["a"], ranked[0]["b"]} == {"ref", "ref_copy.zip"}, f"{problem}: top pair is {ranked[0]}"
        planted = float(ranked[0]["similarity"])
        others = [float(r["similarity"]) for r in ranked[1:]]
        if problem in samples:
            assert len(others) >= 9, f"{problem}: the independent solutions are missing from the ranking"
            assert planted > max(others), f"{problem}: planted {planted} vs independent {max(others)}"


def test_pairs_csv_columns_range_order_and_names(report_dir, batch):
    rows = _rows(report_dir)
    with open(report_dir / "pairs.csv", newline="") as handle:
        assert next(csv.reader(handle)) == ["problem", "a", "b", "similarity"]
    names = {r["a"] for r in rows} | {r["b"] for r in rows}
    assert names == {"ref", "ref_copy.zip", "sample_a", "sample_b", "sample_c"}   # as grades.csv names them
    for problem in {r["problem"] for r in rows}:
        values = [float(r["similarity"]) for r in rows if r["problem"] == problem]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert values == sorted(values, reverse=True), f"{problem}: not ranked"
        assert len(values) == 10 or problem not in sample_bodies()   # every pair of the 5 implementations


def test_bad_inputs_are_listed_never_fatal(batch):
    report = similarity.build_report(batch)
    skipped = dict(report.skipped)
    assert "not a readable zip" in skipped["broken.zip"]
    assert "no student file" in skipped["no_code"]
    assert report.empty == ["starter"]
    assert report.submissions == 6


def test_starter_and_provided_text_create_no_similarity(tmp_path):
    """Each region: its stub, then a copy of a provided helper (code and docstring) of the kit."""
    regions = [r for regions in kit_regions().values() for r in regions]
    source = (ROOT / "pipeline" / "partition.py").read_text()
    helper = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef))
    provided = ast.get_source_segment(source, helper) + "\n"
    for name in ("x", "y"):
        bodies = {(r.id, r.function): textwrap.dedent(stub_body(r)) + provided for r in regions}
        write_submission(tmp_path / name, bodies)
    report = similarity.build_report(tmp_path)
    assert report.rows == []
    assert report.empty == ["x", "y"] and report.skipped == []


def test_renaming_comments_and_layout_do_not_change_the_tokens():
    kept = frozenset({"helper"})
    one = similarity.tokens_of("total = helper(x, 3)  # add\nreturn total\n", kept)
    two = similarity.tokens_of("# different\nresult = helper(\n    y,\n    0x7F\n)\n\nreturn result\n", kept)
    assert [t.text for t in one] == [t.text for t in two] == ["V", "=", "helper", "(", "V", ",", "N", ")", ";",
                                                              "return", "V", ";"]
    strings = similarity.tokens_of('x.y = f"{a}" \'b\' """c\nd"""\n', kept)
    assert [t.text for t in strings] == ["V", ".", "y", "=", "S", ";"]


class _Page(HTMLParser):
    """Collects tags, each <pre>'s caption, and the rows of each problem's ranking table."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.captions: list[str] = []
        self.pre_captions: list[str] = []
        self.first_rows: dict[str, list[str]] = {}
        self._text: list[str] | None = None
        self._problem = ""
        self._cells: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag in ("figcaption", "td", "h2"):
            self._text = []
        if tag == "pre":
            self.pre_captions.append(self.captions[-1] if self.captions else "")

    def handle_endtag(self, tag):
        if self._text is None or tag not in ("figcaption", "td", "h2"):
            return
        text = "".join(self._text).strip()
        if tag == "figcaption":
            self.captions.append(text)
        elif tag == "h2":
            self._problem = text.removeprefix("Problem ")
        elif tag == "td":
            self._cells.append(text)
            if len(self._cells) == 4:
                self.first_rows.setdefault(self._problem, self._cells[1:3])
                self._cells = []
        self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def test_html_parses_names_every_file_shows_planted_pair_first_and_escapes(report_dir):
    text = (report_dir / "index.html").read_text()
    page = _Page()
    page.feed(text)
    page.close()
    assert "script" not in page.tags
    assert "&lt;script&gt;" in text and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in text
    files = {rel for rel in kit_regions()}
    names = {"ref", "ref_copy.zip", "sample_a", "sample_b", "sample_c"}
    assert page.pre_captions and len(page.pre_captions) == text.count("<pre>")
    for caption in page.pre_captions:
        submission, _, rest = caption.partition(": ")
        assert submission in names and rest.split(" ")[0] in files, f"caption {caption!r} names no file"
    problems = {region.id for regions in kit_regions().values() for region in regions}
    for problem in problems:
        assert set(page.first_rows[problem]) == {"ref", "ref_copy.zip"}, f"{problem}: {page.first_rows[problem]}"
    assert "broken.zip" in text and "no_code" in text and "a reason to look, not a verdict" in text
    assert 'class="m"' in text       # shared lines are highlighted


def test_cli_similarity_and_usage_error(batch, tmp_path):
    out = tmp_path / "report"
    done = run_kit_command(["similarity", batch, "--out", out], timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "pairs.csv").is_file() and (out / "index.html").is_file()
    assert "broken.zip" in done.stderr
    listed = {line.split(": ")[1] for line in done.stderr.splitlines() if line.startswith("left out: ")}
    count = re.search(r"; (\d+) entr(?:y|ies) unreadable or with files ignored \(listed above\); wrote", done.stdout)
    assert count and int(count[1]) == len(listed) >= 1, done.stdout
    bad = run_kit_command(["similarity", tmp_path / "missing", "--out", out], timeout=300)
    assert bad.returncode == 2 and "not a folder" in bad.stderr
    assert similarity.run(batch, tmp_path / "other", top=-1) == 2
    (tmp_path / "a_file").write_text("")
    assert similarity.run(batch, tmp_path / "a_file") == 2


def test_batch_similarity_option_writes_the_report(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "broken.zip").write_bytes(b"not a zip")
    (subs / "no_code").mkdir()
    done = run_kit_command(["batch", subs, "--out", tmp_path / "g.csv", "--similarity", tmp_path / "sim", "--quiet"])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "g.csv").is_file()
    assert "broken.zip" in (tmp_path / "sim" / "index.html").read_text()
