"""Issue 38.1: on a released starter every entry point and every benchmark flag refuses in one line, exit 2.

A starter with every problem a course may hand out (1-5 in this kit) and the default one (1-3) are released once
each. On them each ``project/run_*.py`` (each mode) and each ``scripts/run_benchmarks.py`` flag must stop before
anything starts: exit code 2, exactly one line (on stderr) naming the sub-problems that command needs and those not
written yet, nothing on stdout, no traceback, no folder written, and torch never imported (so no rank can
have started). Under torchrun (2 ranks) the line is printed once and torchrun's own report is what the
handout says it is. The files a starter ships mention only paths and README sections the starter has.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grading.commands.release import release, released
from grading.kit.course import DEFAULT_PROBLEMS, is_example, present_problems
from project import readiness
from common import ROOT

pytestmark = pytest.mark.kit

ALL = tuple(p for p in present_problems() if not is_example(p))      # every problem a course may hand out
HEAVY = ("torch", "transformers", "deepspeed")

# command line -> the one line it prints on the starter with Problems 1-5
ENTRY_POINTS = {
    ("project/run_data_parallel.py",):
        "project/run_data_parallel.py needs Problems 1.1 and 1.2: Problems 1.1 and 1.2 are not implemented yet",
    ("project/run_pipeline.py",):
        "project/run_pipeline.py --model_parallel_mode pipeline_parallel needs Problems 2.1, 2.2 and 2.3: "
        "Problems 2.1, 2.2 and 2.3 are not implemented yet",
    ("project/run_pipeline.py", "--model_parallel_mode", "model_parallel"):
        "project/run_pipeline.py --model_parallel_mode model_parallel needs Problem 2.3: "
        "Problem 2.3 is not implemented yet",
    ("project/run_finetune.py",):
        "project/run_finetune.py needs Problems 1.1, 1.2, 3.1, 3.2 and 3.3: "
        "Problems 1.1, 1.2, 3.1, 3.2 and 3.3 are not implemented yet",
    ("project/run_capstone.py",):
        "project/run_capstone.py needs Problems 4.1, 4.2 and 4.3: Problems 4.1, 4.2 and 4.3 are not implemented yet",
    ("project/run_tensor_parallel.py",):
        "project/run_tensor_parallel.py needs Problems 5.1 and 5.2: Problems 5.1 and 5.2 are not implemented yet",
}
BASE = "1.1 and 1.2 (data_parallel) or 2.1, 2.2 and 2.3 (pipeline)"
BENCH = "scripts/run_benchmarks.py"
# benchmark flags -> the line on the starter with Problems 1-5, and on the default starter (1-3)
BENCH_FLAGS = {
    (): (f"{BENCH} needs Problems {BASE}: Problems 1.1, 1.2, 2.1, 2.2 and 2.3 are not implemented yet",) * 2,
    ("--quick",): (f"{BENCH} needs Problems {BASE}: Problems 1.1, 1.2, 2.1, 2.2 and 2.3 are not implemented yet",) * 2,
    ("--mode", "grader"):
        (f"{BENCH} needs Problems {BASE}: Problems 1.1, 1.2, 2.1, 2.2 and 2.3 are not implemented yet",) * 2,
    ("--peers",): (
        f"{BENCH} --peers needs Problems {BASE}; it measures 3.1 (finetune) and 1.2, 4.1 and 4.2 (ddp_zero) too "
        "where written: Problems 1.1, 1.2, 2.1, 2.2, 2.3, 3.1, 4.1 and 4.2 are not implemented yet",
        f"{BENCH} --peers needs Problems {BASE}; it measures 3.1 (finetune) too where written: "
        "Problems 1.1, 1.2, 2.1, 2.2, 2.3 and 3.1 are not implemented yet"),
    ("--tensor_parallel",): (
        f"{BENCH} --tensor_parallel needs Problems {BASE}, and 5.1 and 5.2 (tensor_parallel): "
        "Problems 1.1, 1.2, 2.1, 2.2, 2.3, 5.1 and 5.2 are not implemented yet",
        f"{BENCH} --tensor_parallel measures Problem 5 (tensor_parallel), which this course does not hand out"),
    ("--peers", "--tensor_parallel"): (
        f"{BENCH} --peers --tensor_parallel needs Problems {BASE}, and 5.1 and 5.2 (tensor_parallel); it measures "
        "3.1 (finetune) and 1.2, 4.1 and 4.2 (ddp_zero) too where written: "
        "Problems 1.1, 1.2, 2.1, 2.2, 2.3, 3.1, 4.1, 4.2, 5.1 and 5.2 are not implemented yet",
        f"{BENCH} --peers --tensor_parallel measures Problem 5 (tensor_parallel), which this course does not "
        "hand out"),
}
TORCHRUN = ("project/run_data_parallel.py", "project/run_finetune.py", "project/run_capstone.py",
            "project/run_tensor_parallel.py")   # the entry points whose ranks torchrun may start


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("starter") / "all"
    release(ROOT, out, problems=ALL)
    return out


@pytest.fixture(scope="module")
def default(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("starter") / "default"
    release(ROOT, out)
    return out


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _refusal(starter: Path, argv: tuple[str, ...], workdir: Path) -> str:
    """Run ``python ARGV --workdir WORKDIR`` in ``starter`` as ``python SCRIPT`` would (``runpy``, as
    ``__main__``), with an ``atexit`` handler that reports which heavy libraries were imported; assert the
    one-line refusal and that nothing ran; return the line."""
    argv = (*argv, "--workdir", str(workdir))
    code = ("import atexit, runpy, sys\n"
            f"atexit.register(lambda: print('imported:', [m for m in {HEAVY!r} if m in sys.modules]))\n"
            f"sys.argv = {list(argv)!r}\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=starter, capture_output=True, text=True, timeout=120,
                          env=_env(), stdin=subprocess.DEVNULL)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, (argv, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, done.stderr[-3000:])
    assert done.stdout.splitlines() == ["imported: []"], (argv, done.stdout[-2000:])   # no rank, no output
    assert not workdir.exists(), f"{argv} wrote {sorted(p.name for p in workdir.iterdir())}"
    return lines[0].removeprefix("error: ")


def _flag_runs() -> list[tuple[str, ...]]:
    """Every on/off flag of the benchmark's command line (and grader mode), so that a new one is not left out."""
    spec = importlib.util.spec_from_file_location("run_benchmarks_cli", ROOT / "scripts" / "run_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    defaults = vars(module.build_parser().parse_args([]))
    assert defaults["mode"] == "student"
    return [(f"--{name}",) for name, value in defaults.items() if value is False] + [("--mode", "grader")]


def _entry_points(starter: Path) -> set[str]:
    """The starter's ``project/run_*.py`` that run as a script (``if __name__ == "__main__":``)."""
    return {p.relative_to(starter).as_posix() for p in (starter / "project").glob("run_*.py")
            if 'if __name__ == "__main__":' in p.read_text()}


def test_the_tables_cover_every_entry_point_flag_and_mode(everything):
    assert _entry_points(everything) == {argv[0] for argv in ENTRY_POINTS}
    lines = {" ".join(argv) for argv in ENTRY_POINTS} | {"project/run_pipeline.py --model_parallel_mode "
                                                         "pipeline_parallel"}   # the default mode
    assert set(readiness.COMMANDS) - {BENCH} <= lines
    assert {(), *_flag_runs()} <= set(BENCH_FLAGS)
    assert {(flag,) for flag in readiness.BENCH_FLAGS} <= set(BENCH_FLAGS)


@pytest.mark.parametrize("argv", list(ENTRY_POINTS), ids=" ".join)
def test_an_entry_point_on_the_starter_refuses_in_one_line_naming_what_it_needs(everything, argv, tmp_path):
    assert _refusal(everything, argv, tmp_path / "workdir") == ENTRY_POINTS[argv]


def test_the_default_starter_has_the_default_entry_points_and_they_refuse_alike(default, tmp_path):
    scripts = _entry_points(default)
    assert scripts == {"project/run_data_parallel.py", "project/run_pipeline.py", "project/run_finetune.py"}
    for argv in (argv for argv in ENTRY_POINTS if argv[0] in scripts):
        assert _refusal(default, argv, tmp_path / "workdir") == ENTRY_POINTS[argv]


@pytest.mark.parametrize("flags", list(BENCH_FLAGS), ids=lambda flags: " ".join(flags) or "no flag")
def test_each_benchmark_flag_refuses_in_one_line_naming_what_it_needs(everything, default, flags, tmp_path):
    for starter, expected in zip((everything, default), BENCH_FLAGS[flags]):
        assert _refusal(starter, (BENCH, *flags), tmp_path / "workdir") == expected


def test_the_tensor_parallel_comparison_alone_refuses_before_any_rank_starts(everything, tmp_path):
    """``python -m project.bench.tensor_parallel`` (its docstring's way to run the comparison alone) measures
    Problem 5: unwritten, it refuses like ``--tensor_parallel`` does, one line and exit 2, and starts no rank."""
    done = subprocess.run([sys.executable, "-m", "project.bench.tensor_parallel", "--quick", "--workdir",
                           str(tmp_path / "workdir")], cwd=everything, capture_output=True, text=True, timeout=120,
                          env=_env(), stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", [
        "error: python -m project.bench.tensor_parallel needs Problems 5.1 and 5.2: Problems 5.1 and 5.2 are not "
        "implemented yet"]), done.stderr[-3000:]
    assert not (tmp_path / "workdir").exists()


@pytest.mark.parametrize("script", TORCHRUN)
def test_under_torchrun_the_line_is_printed_once_and_torchrun_reports_as_the_handout_says(everything, script,
                                                                                          tmp_path):
    workdir = tmp_path / "workdir"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           script, "--workdir", str(workdir)], cwd=everything, capture_output=True, text=True,
                          timeout=300, env=_env(), stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if line.startswith("error:")]
    assert ours == [f"error: {ENTRY_POINTS[(script,)]}"], output[-4000:]
    assert done.returncode == 1, output[-4000:]   # torchrun's own exit code when a rank failed
    assert "failed (exitcode: 2) local_rank: 0 " in done.stderr, done.stderr[-4000:]
    assert "ChildFailedError" in done.stderr and f"{script} FAILED" in done.stderr, done.stderr[-4000:]
    report = done.stderr.split("Root Cause (first observed failure):")
    assert len(report) == 2 and "rank      : 0 (local_rank: 0)\n  exitcode  : 2 " in report[1], done.stderr[-4000:]
    others = re.findall(r"exitcode  : (-?\d+)", report[0])   # rank 1 had exited (code 0), or torchrun stopped it
    assert ("<NO_OTHER_FAILURES>" in report[0] and not others) or others == ["-15"], report[0]
    frames = re.findall(r'^\s*File "([^"]+)"', done.stderr, flags=re.M)
    assert not [f for f in frames if str(everything) in f], frames   # the traceback is torchrun's, not the kit's
    assert not workdir.exists()
    handout = (everything / "README.md").read_text()
    for claim in ("`failed (exitcode: 2) local_rank: 0 ...`", "`ChildFailedError`", "`exitcode  : 2`",
                  "`<NO_OTHER_FAILURES>`", "SIGTERM", "exits with code 1"):
        assert claim in handout, claim


# Reference-like text: a kit path, or "the README's <Section>"
PATH = re.compile(r"(?<![\w/.-])((?:tests|scripts|project|grading|common|docs|data_parallel|pipeline|finetune|"
                  r"tensor_parallel|submit_figures)/[\w/.-]*\w\.(?:py|sh|md|json|txt|ini|toml))\b")
SECTION = re.compile(r"README'?s ([A-Z][\w-]*)")
TEXT = {".py", ".md", ".txt", ".sh", ".ini", ".toml", ".cfg"}
# The grader a starter ships (grading/) is the staff's code: its docstrings and messages may name the staff files
# (docs/, tests/kit/, grading/staff/, staff scripts) that the release leaves out; nothing a student works in may.
GRADER = "grading/"


def dangling(starter: Path, problems: tuple[str, ...]) -> dict[str, list[str]]:
    """``{file: [reference, ...]}``: the paths and README sections the starter's files mention but it lacks.

    A path of an optional problem the course did not choose (a file the kit has and ``release`` leaves out
    for that reason) is not dangling: the starter's code knows the optional problems and refuses them.
    """
    headings = [line.lstrip("#").strip() for line in (starter / "README.md").read_text().splitlines()
                if line.startswith("#")]
    found: dict[str, list[str]] = {}
    for file in sorted(starter.rglob("*")):
        rel = file.relative_to(starter).as_posix()
        if not file.is_file() or file.suffix not in TEXT or rel.startswith("grading/pristine/"):
            continue
        text = file.read_text()
        for ref in PATH.findall(text):
            optional = (ROOT / ref).is_file() and released(ref, ALL) and not released(ref, problems)
            staff = rel.startswith(GRADER) and not released(ref, ALL)
            if not (starter / ref).exists() and not optional and not staff:
                found.setdefault(rel, []).append(ref)
        for section in SECTION.findall(text):
            if not any(h.startswith(section) for h in headings):
                found.setdefault(rel, []).append(f"README's {section}")
    return found


def test_the_starters_files_mention_only_what_the_starter_has(everything, default):
    for starter, problems in ((everything, ALL), (default, DEFAULT_PROBLEMS)):
        found = dangling(starter, problems)
        assert not found, found
        assert "requirements.txt" not in found and "-n 2" not in (starter / "requirements.txt").read_text()


def test_the_check_finds_a_dangling_path_and_section(tmp_path):
    """The check above can fail: the kit's old requirements comments are caught, a present path is not."""
    (tmp_path / "README.md").write_text("# Set-up\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "two_ranks.py").write_text("")
    (tmp_path / "requirements.txt").write_text("# the README's Dependencies; the README's Set-up\n"
                                               "# tests/test_peft_interop.py, scripts/two_ranks.py\n")
    assert dangling(tmp_path, ("1", "2", "3")) == {"requirements.txt": ["tests/test_peft_interop.py",
                                                                        "README's Dependencies"]}


def test_the_benchmark_help_names_only_the_chosen_problems_and_no_duration(everything, default):
    """``--help`` of the default starter says nothing of Problems 4-5, their flags or the readiness
    tables, and no starter states how long a run takes."""
    helps = {}
    for starter in (everything, default):
        done = subprocess.run([sys.executable, "scripts/run_benchmarks.py", "--help"], cwd=starter, text=True,
                              capture_output=True, timeout=60, env=_env())
        assert done.returncode == 0, done.stderr[-2000:]
        helps[starter] = done.stdout
        assert not re.search(r"\babout (an?|[\d.]+) (seconds?|minutes?)|[\d.]+ ?(s|min|minutes?)\b|BENCH_FLAGS|"
                             r"readiness", done.stdout), done.stdout
    for text in ("--tensor_parallel", "Problem 4", "Problem 5", "BucketedDDP"):
        assert text in helps[everything] and text not in helps[default], text


def test_the_starter_tracks_the_written_analysis_and_ignores_generated_figures(default, tmp_path):
    """With the starter's own ``.gitignore``, ``git`` ignores the benchmark's figures and JSON in
    ``submit_figures/`` but not the student's answers there (``analysis.md``, shipped as the template)."""
    assert (default / "submit_figures" / "analysis.md").is_file()
    (tmp_path / ".gitignore").write_text((default / ".gitignore").read_text())
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    names = ["analysis.md", ".gitkeep", "data_parallel.png", "performance_summary.json", "tensor_parallel.png"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *(f"submit_figures/{n}" for n in names)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)   # prints the ignored ones
    assert done.stdout.split() == [f"submit_figures/{n}" for n in names[2:]], done.stdout + done.stderr
