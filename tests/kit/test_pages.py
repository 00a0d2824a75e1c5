"""Every HTML page the kit writes (class report, similarity report, mutants report), opened in headless Chromium:
each renders within a 1,400 px window, every link and image it names is there, and no chart is empty. Built from
tiny inputs like those of test_class_report.py, test_similarity.py and test_mutants.py. The timeline figure's bar
labels fit inside their bars.

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``); where it is absent the browser test
skips with one line and the link check still runs here, in Python.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from grading.commands import mutants, similarity
from grading.commands.class_report import render as render_class_report, write_class_report
from grading.kit.mutations import Equivalent, Mutant
from tests.kit.similarity_samples.make import planted_copy, reference_bodies, sample_bodies, write_submission

pytestmark = pytest.mark.kit

WINDOW = (1400, 1000)
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
# appended to a copy of a page, next to it: what Chromium made of it, once everything has loaded
PROBE = """<script>window.addEventListener("load", () => {
  const out = document.createElement("pre"); out.id = "kit-probe";
  out.textContent = JSON.stringify({
    links: [...document.links].map(a => a.href),
    missing_anchors: [...document.links].filter(a => a.hash && a.pathname === location.pathname)
      .map(a => a.hash).filter(h => !document.getElementById(decodeURIComponent(h.slice(1)))),
    images: [...document.images].map(i => [i.getAttribute("src"), i.naturalWidth, i.naturalHeight]),
    width: document.documentElement.scrollWidth, window: window.innerWidth,
    title: document.title, h1: (document.querySelector("h1") || {}).textContent});
  document.body.appendChild(out);});</script>"""


def _result(cid: str, status: str, output: str = "passed", points: float = 1.0, hidden: bool = False) -> dict:
    return {"name": f"{cid}: title of {cid}", "number": cid.rsplit(".", 1)[0], "score": points if status == "passed"
            else 0.0, "max_score": points, "status": status, "output": output,
            "visibility": "after_published" if hidden else "visible"}


def _class_report(out: Path) -> Path:
    """Twelve submissions over Problems 1 and 2, public and hidden criteria, each linked to its grade."""
    rng = random.Random(0)
    criteria = [("1.1.exact", 3.0, False), ("1.1.exact_hidden", 1.0, True), ("1.2.grads", 4.0, False),
                ("1.2.grads_hidden", 2.0, True), ("2.1.cycles", 3.0, False), ("2.1.cycles_hidden", 3.0, True)]
    results, students = {}, []
    for k in range(12):
        name = f"student {k}"
        results[name] = {"tests": [_result(cid, "passed" if rng.random() < 0.6 else "failed",
                                           f"rank {k % 2}: differs by {rng.random():.1e}", points, hidden)
                                   for cid, points, hidden in criteria]}
        folder = out / "grades_results" / name
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps(results[name]))
        (folder / "report.txt").write_text("table\n")
        students.append({"submission": name, "score": "1", "max_score": "16", "status": "failed", "notes": "",
                         "results": f"grades_results/{name}/results.json"})
    return write_class_report(out / "grades.csv", results, {"late": "rejected"}, students, ("1", "2"))["html"]


def _similarity(out: Path, scratch: Path, class_report: Path) -> Path:
    """The reference, its planted copy and an independent sample; linked to ``class_report``, as ``batch`` does."""
    reference = reference_bodies()
    write_submission(scratch / "ref", reference)
    write_submission(scratch / "ref_copy", {key: planted_copy(body, random.Random(7))
                                            for key, body in reference.items()})
    write_submission(scratch / "sample_a", {key: body for per in sample_bodies().values()
                                            for key, body in per["a"].items()})
    assert similarity.run(scratch, out, class_report=class_report) == 0
    return out / "index.html"


def _mutants(out: Path, monkeypatch) -> Path:
    """A survivor, a listed equivalent, one listed but killed, a stale one: every section filled, each graded
    mutant's grade kept in its folder (``mutants.grade_folder``)."""
    path = "data_parallel/comm.py"
    every = [Mutant(f"1.2/average_gradients/ReplaceBinaryOperator_Div_Mul/{k}", "1.2", path, 40 + k,
                    "ReplaceBinaryOperator_Div_Mul", k, f"line {k}") for k in range(4)]
    listed = [Equivalent(every[2].id, "line 2", "same result"), Equivalent(every[3].id, "line 3", "same"),
              Equivalent("1.2/f/Op/9", "line 9", "gone")]
    monkeypatch.setattr(mutants, "listed_equivalents", lambda problem: listed)
    long_line = "        parameter.grad /= world_size  # " + "a long comment " * 20 + "\n"
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -40,1 +40,1 @@\n-{long_line}+{long_line.replace('/=', '*=')}"
    records = [{"verdict": verdict, "seconds": 1.0, "passed": ["1.2.grads"], "diff": diff, "notes": "",
                "failed": ["1.2.b"] if verdict == "killed" else [], "status": "passed"}
               for verdict in ("killed", "survived", "survived", "killed")]
    for mutant in every:
        folder = mutants.grade_folder(out, mutant.id)
        folder.mkdir(parents=True)
        (folder / "report.txt").write_text("table\n")
        (folder / "results.json").write_text("{}\n")
    report = mutants.summary(every, every, records, {"seconds": 4.0, "jobs": 1, "sample": None, "seed": None})
    mutants.write_report(out, report)
    return out / mutants.HTML_NAME


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pages")
    class_report = _class_report(root)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {"class report": class_report,
                "similarity": _similarity(root / "similarity", tmp_path_factory.mktemp("subs"), class_report),
                "mutants": _mutants(root / "mutants", monkeypatch)}


class _Targets(HTMLParser):
    """Every ``href`` and ``src`` of a page, and its element ids."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        self.targets += [found[name] for name in ("href", "src") if found.get(name)]
        if found.get("id"):
            self.ids.add(found["id"])


@pytest.mark.parametrize("name", ["class report", "similarity", "mutants"])
def test_every_link_and_image_of_a_page_is_there(pages, name):
    page = pages[name]
    parser = _Targets()
    parser.feed(page.read_text())
    assert parser.targets, f"{name}: no links at all"
    for target in parser.targets:
        parts = urlsplit(target)
        assert not parts.scheme and not parts.netloc, f"{name}: {target!r} is not a relative link"
        if parts.path:
            assert (page.parent / unquote(parts.path)).is_file(), f"{name}: {target!r} names no file next to {page}"
        else:
            assert unquote(parts.fragment) in parser.ids, f"{name}: {target!r} names no element of the page"
    if name == "mutants":      # each graded mutant links to its grade
        assert sum("/report.txt" in t for t in parser.targets) == 3, parser.targets


HOSTILE = '<script>alert("x")</script>'


class _Text(HTMLParser):
    """A page's tags and its text as a reader sees it (entities decoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.text.append(data)


def _hostile_page(name: str, monkeypatch) -> str:
    """Page ``name`` with ``HOSTILE`` as the submission names, paths, statuses and messages it shows."""
    if name == "class report":
        paths = {kind: Path(f"grades_class_report.{kind}") for kind in ("csv", "png", "scores_csv", "scores_png")}
        row = {"criterion": "1.1.exact", "title": HOSTILE, "problem": "1", "points": 1, "visibility": "visible",
               "attempted": 1, "not_attempted": 0, "passed": 0, "pass_rate": "0.000", "failure_1": HOSTILE,
               "sharing_1": 1, "likely_cause_1": HOSTILE}
        student = {"submission": HOSTILE, "score": "", "max_score": "1", "status": "failed", "notes": HOSTILE,
                   "results": f"grades_results/{HOSTILE}/results.json"}
        return render_class_report(paths, [row], [], 1, {HOSTILE: "rejected"}, [student], {})
    if name == "similarity":
        entry = similarity.Entry(HOSTILE, "1.1", [similarity.Piece(HOSTILE, "f", HOSTILE)])
        other = similarity.Entry("b", "1.1", [similarity.Piece("x.py", HOSTILE, "y = 1")])
        report = similarity.Report([("1.1", HOSTILE, "b", 0.5)], {"1.1": {HOSTILE: entry, "b": other}},
                                        [(HOSTILE, HOSTILE)], [HOSTILE], 2, {"1.1": frozenset()})
        return similarity.render_html(report, class_report=HOSTILE)
    every = [Mutant(f"1.2/f/Op/{k}", "1.2", "x.py", k + 1, "Op", k, "") for k in range(3)]
    monkeypatch.setattr(mutants, "listed_equivalents",
                        lambda problem: [Equivalent(every[2].id, "", HOSTILE)])
    records = [{"verdict": verdict, "seconds": 1.0, "passed": [HOSTILE], "failed": [], "status": HOSTILE,
                "diff": HOSTILE, "notes": HOSTILE} for verdict in ("survived", "error", "survived")]
    return mutants.page(mutants.summary(every, every, records, {"seconds": 1.0, "jobs": 1,
                                                                              "sample": None, "seed": None}))


@pytest.mark.parametrize("name", ["class report", "similarity", "mutants"])
def test_student_text_with_markup_and_quotes_shows_as_text(name, monkeypatch):
    page = _hostile_page(name, monkeypatch)
    parser = _Text()
    parser.feed(page)
    parser.close()
    assert "script" not in parser.tags, f"{name}: a submission's '<script>' became a tag (text not escaped)"
    shown = "".join(parser.text).count(HOSTILE)
    assert shown >= 3, f"{name}: {HOSTILE!r} shows {shown} time(s) as text, expected in every place it was given"
    assert 'alert("x")' not in page, f"{name}: a '\"' of student text is not escaped (it could end an attribute)"

def _non_white(path: Path) -> float:
    """The share of pixels of a PNG that are not white (0: a blank image)."""
    import matplotlib.image

    pixels = matplotlib.image.imread(str(path))[..., :3]
    return float((pixels.min(axis=-1) < 0.95).mean())


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("name, title", [("class report", "Class report"), ("similarity", "Similarity report"),
                                         ("mutants", "Mutation analysis of the checks")])
def test_each_page_renders_in_chromium_with_its_links_and_charts(pages, name, title):
    page = pages[name]
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    done = _chromium("--virtual-time-budget=1000", "--dump-dom", probe.as_uri())
    probe.unlink()
    found = re.search(r'<pre id="kit-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"{name}: Chromium did not load the page: {done.stderr[-500:]}"
    seen = json.loads(found[1].replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert seen["h1"] == title, seen
    for link in seen["links"]:
        if link.startswith("file://") and "#" not in link:
            assert Path(unquote(urlsplit(link).path)).is_file(), f"{name}: the link {link} leads nowhere"
    assert not seen["missing_anchors"], f"{name}: links to no element: {seen['missing_anchors']}"
    assert seen["width"] <= seen["window"], f"{name}: {seen['width']} px wide, past a {WINDOW[0]} px window"
    for src, width, height in seen["images"]:       # every chart loads and has something drawn on it
        assert width > 100 and height > 100, f"{name}: the image {src} did not load ({width}x{height})"
        assert _non_white(page.parent / unquote(src)) > 0.02, f"{name}: the chart {src} is blank"
    if name == "class report":
        assert len(seen["images"]) == 2, seen["images"]


def test_the_timeline_labels_fit_inside_their_bars(tmp_path, monkeypatch):
    """Sixteen micro-batches, the first of each stage a sliver: no label drawn wider than its bar."""
    from project.bench import figures

    def tasks(microbatches: int, scale: float) -> list[dict]:
        out = [{"stage": stage, "microbatch": mb, "start": (mb + stage) * scale,
                "end": (mb + stage) * scale + scale * (0.9 if mb else 0.1)}
               for mb in range(microbatches) for stage in (0, 1)]
        return out + [{"stage": "backward", "microbatch": 0, "start": (microbatches + 1) * scale,
                       "end": (microbatches + 3) * scale}]

    m = 16
    summary = {"hardware": {"gpus": []}, "pipeline": {
        "timeline": {"microbatches": m, "stages": 2, "model_parallel": {"tasks": tasks(1, 0.05), "repeat": 1},
                     f"pipeline_parallel_m{m}": {"tasks": tasks(m, 0.004), "repeat": 1}},
        "variants": {variant: {"run_times_s": [1.0, 1.1, 1.2], "measured_bubble": 0.2}
                     for variant in ("model_parallel", f"pipeline_parallel_m{m}")}}}
    fitted = []
    original = figures._fit_labels

    def checked(fig, labels, *args, **kwargs):
        original(fig, labels, *args, **kwargs)
        fitted.append(len(labels))
        renderer = fig.canvas.get_renderer()
        for ax, start, width, text in labels:
            left, right = ax.transData.transform([(start, 0.0), (start + width, 0.0)])[:, 0]
            if text.get_visible():
                assert text.get_window_extent(renderer).width <= right - left, \
                    f"label {text.get_text()} is wider than its bar ({right - left:.0f} px)"

    monkeypatch.setattr(figures, "_fit_labels", checked)
    figures.draw_timeline(summary, tmp_path / "timeline.png")
    assert fitted == [2 * (m + 1)]


def _drawn(monkeypatch) -> list:
    """The figures saved from now on (each ``savefig`` records its figure)."""
    import matplotlib.figure

    saved, original = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: (saved.append(self), original(self, *a, **k))[1])
    return saved


def test_the_class_charts_read_at_a_glance(tmp_path, monkeypatch):
    """The hidden subtotal has an axis of its own (its 2 points, not the total's 8); the pass-rate plot takes most
    of its figure's width, labels each bar with its rate and has its axis at the top as well as the bottom."""
    saved = _drawn(monkeypatch)
    results = {f"s{k}": {"tests": [_result("1.1.a", "passed" if k % 2 else "failed", points=6),
                                   _result("1.1.h", "passed" if k % 3 else "failed", points=2, hidden=True),
                                   _result("1.2.b", "passed" if k % 4 else "failed", points=3)]} for k in range(6)}
    write_class_report(tmp_path / "grades.csv", results, problems=("1",))
    rates = next(f for f in saved if any("Pass rate" in str(ax.get_legend() and ax.get_legend().get_title().get_text())
                                         for ax in f.axes))
    (ax,) = rates.axes
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["50 % (3/6)", "67 % (4/6)", "67 % (4/6)"], labels      # 1.1.a, 1.1.h (hidden), 1.2.b
    assert any(tick.label2.get_visible() for tick in ax.xaxis.get_major_ticks()), "no rate axis at the top"
    assert ax.get_window_extent().width >= 0.6 * rates.bbox.width, "the plot is a sliver of its figure"
    scores = next(f for f in saved if f is not rates)
    hidden_axes = [a for a in scores.axes if any("hidden" in t.get_text() for t in
                                                 (a.get_legend().get_texts() if a.get_legend() else []))]
    assert len(hidden_axes) == 1 and hidden_axes[0].get_xlim()[1] <= 2.5, [a.get_xlim() for a in hidden_axes]


def test_identical_code_is_highlighted_on_every_line(tmp_path):
    """Two copies of the same solution: every line of every pane is marked, end to end."""
    bodies = {key: body for per in sample_bodies().values() for key, body in per["a"].items()}
    for name in ("x", "y"):
        write_submission(tmp_path / "subs" / name, bodies)
    assert similarity.run(tmp_path / "subs", tmp_path / "out") == 0
    text = (tmp_path / "out" / "index.html").read_text()
    panes = re.findall(r"<figcaption>(.*?)</figcaption><pre>(.*?)</pre>", text, re.S)
    assert panes
    for caption, body in panes:
        bare = [line for line in body.split("\n") if line.strip() and not line.startswith('<span class="m">')]
        assert not bare, f"{caption}: lines not highlighted: {bare[:3]}"
