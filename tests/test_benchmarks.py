"""scripts/run_benchmarks.py: one real ``--quick --peers`` run on CPU, its summary recomputed from its raw log.

No test asserts a time: the numbers on a shared 2-core machine are noise.
What must hold whatever the machine does: every ratio is a ratio of times of
the same work, recomputable from the raw stamps; tokens are the real tokens
of the global batches, counted once; runs alternate; ours and the peers
compute the same gradients; without 2 GPUs the thresholds do not apply.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import runpy
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from project.bench import REQUIRED_FIGURES, SUMMARY_NAME, ddp_peers, report, stats
from project.devices import THREAD_POLICY
from tests.conftest import start_project_rank_server
from common import ROOT

pytestmark = pytest.mark.kit



# -- the arithmetic, on hand-made numbers ---------------------------------------------------------------

def test_run_time_is_the_sum_over_steps_of_the_slowest_rank():
    ranks = [[[0.0, 1.0], [1.0, 1.5]], [[0.0, 0.5], [1.0, 2.0]]]   # rank 0 slow first, rank 1 slow second
    assert stats.run_time(ranks) == pytest.approx(1.0 + 1.0)
    assert stats.step_times(ranks) == [1.0, 1.0]
    with pytest.raises(ValueError):
        stats.run_time([[[0, 1]], [[0, 1], [1, 2]]])


def test_paired_ratios_rotation_and_bubbles():
    assert stats.paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [1.0, 2.0])
    assert stats.rotation(["a", "b"], 0) == ["a", "b"] and stats.rotation(["a", "b"], 1) == ["b", "a"]
    assert stats.theoretical_bubble(4, 2) == pytest.approx(1 / 5)
    # two stages, two micro-batches, perfectly staggered: 4 busy units in a 2 x 3 rectangle
    tasks = [{"stage": 0, "start": 0, "end": 1}, {"stage": 0, "start": 1, "end": 2},
             {"stage": 1, "start": 1, "end": 2}, {"stage": 1, "start": 2, "end": 3}]
    assert stats.measured_bubble(tasks, 2) == pytest.approx(1 - 4 / 6)


def test_a_ratio_is_the_quotient_of_the_two_step_times_not_the_median_of_per_repeat_ratios():
    """The issue's shape: per-repeat ratios whose median (1.5) is not the quotient of the step times (1.0); the
    ratio is the latter, printed as the step times' quotient, with the per-repeat values labelled as the spread."""
    ratio = stats.time_ratio([1.0, 2.0, 3.0], [3.0, 1.0, 2.0])
    assert ratio == {"value": 1.0, "per_repeat": [1 / 3, 2.0, 1.5]}
    assert statistics.median(ratio["per_repeat"]) == 1.5 != ratio["value"]
    assert ratio["value"] == stats.step_time_ms([1.0, 2.0, 3.0], 4) / stats.step_time_ms([3.0, 1.0, 2.0], 4)
    line = report.table({"workload": {"parameters": 10, "preset": "tiny", "repeats": 3, "steps": 4},
                         "data_parallel": {"variants": {}, "ratios": {"speedup": {
                             "numerator": "world_size_1", "denominator": "world_size_2", **ratio}}}})
    assert line.splitlines()[-1].split() == ["speedup", "1.00x", "(step_time_ms", "world_size_1", "/", "world_size_2;",
                                             "per-repeat", "ratios", "(spread,", "repeat", "1", "first):", "0.33,",
                                             "2.00,", "1.50)"]
    assert "median over 3 repeats of (run time / 4 steps)" in line and stats.RATIO in line


def test_stage_parameters_and_saved_activations_are_counted_per_stage():
    """Parameters per stage add up to the model's (the tied head weight counts once, on stage 0); the saved bytes
    are the distinct non-parameter storages autograd keeps, per stage (a Linear keeps its input, a ReLU its
    output)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.gpt2 import build_pipeline_gpt2
    from project.bench import memory
    from project.model import PRESETS, count_parameters

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, **PRESETS["tiny"]))
    net = build_pipeline_gpt2(model, ["cpu", "cpu"], "model_parallel")
    counts = memory.parameters_per_stage(memory.stages_of(net))
    assert len(counts) == 2 and sum(counts) == count_parameters(model) and min(counts) > 0
    stages = [torch.nn.Linear(4, 3), torch.nn.ReLU()]
    with memory.saved_activation_bytes(stages) as saved:
        out = stages[1](stages[0](torch.randn(5, 4)))
    assert saved == [5 * 4 * 4, 5 * 3 * 4]
    out.sum().backward()


def _summary(dp: float, pp: float) -> dict:
    return {"data_parallel": {"ratios": {"speedup": {"value": dp}}},
            "pipeline": {"ratios": {"speedup_m2": {"value": pp - 0.1}, "speedup_m4": {"value": pp}}}}


def test_thresholds_judge_on_two_gpus_and_do_not_apply_elsewhere():
    verdict = report.judge(_summary(1.5, 1.0), 1.4, 1.1, gpus=2)
    assert (verdict["dp_speedup"]["status"], verdict["pp_speedup"]["status"]) == ("pass", "fail")
    assert verdict["pp_speedup"]["measured"] == 1.0            # the best n_chunk is judged
    assert report.exit_code({"mode": "grader", "thresholds": verdict}) == 1
    assert report.exit_code({"mode": "student", "thresholds": verdict}) == 0
    elsewhere = report.judge(_summary(0.5, 0.5), 1.4, 1.1, gpus=0)
    assert not elsewhere["applicable"] and "do not apply" in elsewhere["reason"]
    assert {elsewhere[k]["status"] for k in ("dp_speedup", "pp_speedup")} == {"not_applicable"}
    assert report.exit_code({"mode": "grader", "thresholds": elsewhere}) == 0
    assert report.exit_code({"mode": "grader", "thresholds": elsewhere, "errors": {"pipeline": "x"}}) == 2


def test_a_clock_cycles_that_breaks_its_contract_is_one_line_before_the_pipeline_is_built(monkeypatch):
    """A schedule whose cycle is a generator would leave Pipe's second walk empty (an error far from its cause);
    the benchmark's pipeline workload refuses it first, naming the contract (ctx is never touched)."""
    from pipeline import schedule
    from project.bench import tasks
    from project.cli import UniformError

    monkeypatch.setattr(schedule, "clock_cycles", lambda m, n: ((task for task in [(0, 0)]) for _ in range(m + n - 1)))
    with pytest.raises(UniformError, match=r"^pipeline/schedule.py: clock_cycles\(4, 2\) .*Problem 2.1's contract"):
        tasks.pipeline_ours(None, "pipeline_parallel", 4)


def test_bad_options_are_refused_before_anything_starts(tmp_path):
    done = subprocess.run([sys.executable, "scripts/run_benchmarks.py", "--quick", "--batch_size", "15",
                           "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "even" in done.stderr, done.stderr
    assert not (tmp_path / "perf").exists()
    done = subprocess.run([sys.executable, "scripts/run_benchmarks.py", "--quick", "--batch_size", "4",
                           "--n_chunks", "3", "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)   # ceil(4/3) = 2 rows a micro-batch: 2 micro-batches would run, not 3
    assert done.returncode == 2 and "make 2 micro-batches, not 3" in done.stderr, done.stderr
    assert not (tmp_path / "perf").exists()


# -- one real run -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(summary, raw records, workload file, figures folder, console text)`` of one ``--quick --peers`` run in
    a private workdir, at the smallest sizes that still show what the tests check: two repeats (alternation),
    one timed step, 8 rows.

    The script's ``main`` runs in this process, as the ``project`` tests run the entry points: its workers fork
    from this process's rank server, which has imported the libraries already (``tests/test_partial_submission.py``
    runs the script as a new interpreter)."""
    work = tmp_path_factory.mktemp("bench")
    start_project_rank_server()
    script = runpy.run_path(str(ROOT / "scripts" / "run_benchmarks.py"), run_name="run_benchmarks")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = script["main"](["--quick", "--peers", "--repeats", "2", "--steps", "1", "--batch_size", "8",
                               "--workdir", str(work / "work"), "--figures_dir", str(work / "figures")])
    assert code == 0, printed.getvalue()[-8000:]
    summary = json.loads((work / "figures" / SUMMARY_NAME).read_text())
    log = Path(summary["raw_log"])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return summary, records, log.parent / "workload.pt", work / "figures", printed.getvalue()


def test_quick_run_writes_readable_figures_and_the_summary(run):
    import matplotlib.image

    summary, _, _, figures, _ = run
    assert set(summary["figures"]) == {*REQUIRED_FIGURES, "peers.png"}
    for name in summary["figures"]:
        height, width = matplotlib.image.imread(figures / name).shape[:2]
        assert height >= 300 and width >= 600, (name, height, width)
    assert not summary["errors"]
    assert {"data_parallel", "pipeline", "finetune", "checks", "hardware", "workload", "thresholds",
            "memory"} <= set(summary)
    assert summary["workload"]["thread_policy"] == THREAD_POLICY          # the runners' policy too
    memory = summary["memory"]                                            # activation checkpointing keeps less
    assert memory["grad_ckpt"]["saved_for_backward_bytes"] < memory["plain"]["saved_for_backward_bytes"]
    assert memory["ratio_saved"] == pytest.approx(memory["plain"]["saved_for_backward_bytes"]
                                                  / memory["grad_ckpt"]["saved_for_backward_bytes"])


def test_summary_numbers_recompute_from_the_raw_log(run):
    summary, records, _, _, _ = run
    for group in ("data_parallel", "pipeline", "finetune"):
        variants = summary[group]["variants"]
        for name, v in variants.items():
            timed = sorted((r for r in records if r["group"] == group and r["variant"] == name and not r["warmup"]),
                           key=lambda r: r["repeat"])
            assert len(timed) == summary["workload"]["repeats"]
            times = [sum(max(rank[s][1] - rank[s][0] for rank in r["ranks"]) for s in range(len(r["ranks"][0])))
                     for r in timed]
            assert v["run_times_s"] == pytest.approx(times, rel=1e-12)
            assert v["median_s"] == pytest.approx(statistics.median(times), rel=1e-12)
            assert v["step_time_ms"] == pytest.approx(1000 * statistics.median(times) / v["steps_per_run"], rel=1e-12)
            assert v["tokens_per_s"] == pytest.approx([v["tokens_per_run"] / t for t in times], rel=1e-12)
            assert v["ranks"] == (2 if v["role"] == "pair" else 1) == len(timed[0]["ranks"])
        for key, r in summary[group]["ratios"].items():
            paired = [a / b for a, b in zip(variants[r["numerator"]]["run_times_s"],
                                            variants[r["denominator"]]["run_times_s"])]
            assert r["per_repeat"] == pytest.approx(paired, rel=1e-12), key
            assert r["value"] == pytest.approx(variants[r["numerator"]]["step_time_ms"]
                                                / variants[r["denominator"]]["step_time_ms"], rel=1e-12), key
    dp = summary["data_parallel"]["ratios"]
    assert (dp["speedup"]["numerator"], dp["speedup"]["denominator"]) == ("world_size_1", "world_size_2")


def test_tokens_are_the_real_tokens_of_the_same_global_batches_counted_once(run):
    summary, records, workload_file, _, _ = run
    batches = torch.load(workload_file, weights_only=True)["batches"]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    assert real < padded          # the corpus has sequences of different lengths: padding exists, and is excluded
    for group in ("data_parallel", "pipeline", "finetune"):
        for name, v in summary[group]["variants"].items():
            assert v["tokens_per_run"] == real, (group, name)   # 2 ranks: one global batch, not 2x the tokens
    for r in records:
        if not r["warmup"]:
            assert r["batch_indices"] == list(range(len(batches)))


def test_runs_alternate_and_warm_up_is_not_timed(run):
    summary, records, _, _, _ = run
    for group in ("data_parallel", "pipeline"):
        names = list(summary[group]["variants"])
        orders = {}
        for r in records:
            if r["group"] == group and not r["warmup"]:
                orders.setdefault(r["repeat"], []).append((r["position"], r["variant"]))
        orders = [[v for _, v in sorted(o)] for _, o in sorted(orders.items())]
        assert all(sorted(o) == sorted(names) for o in orders)
        assert orders[0] != orders[1] and orders[0][0] == names[0] != orders[1][0]
        assert {r["variant"] for r in records if r["group"] == group and r["warmup"]} == set(names)


def test_ours_and_the_peers_compute_the_same_gradients(run):
    checks = run[0]["checks"]
    assert {"dp_ours_vs_serial", "dp_ddp_vs_serial", "dp_flat_vs_serial", "gpipe_m4_vs_pipe_ours",
            "lora_peft_vs_ours_grads", "lora_peft_vs_ours_logits"} <= set(checks)
    for name, check in checks.items():
        assert check["ok"] and check["max_abs_diff"] <= 1e-5, (name, check)
    assert checks["lora_peft_vs_ours_grads"]["reference_max_abs"] > 0   # non-zero gradients were compared


def test_the_problem_4_group_recomputes_and_shards_the_optimizer_state(run):
    """``--peers`` also measured Problem 4 (``project/bench/ddp_peers.py``): its ratios recompute from its run times,
    and each rank's optimizer state is 12 bytes a parameter over the world size (ours and DeepSpeed ZeRO-1/2)."""
    summary = run[0]
    group = summary["ddp_zero"]
    assert "ddp_zero" not in summary["errors"]
    times = {name: v["run_times_s"] for name, v in group["variants"].items()}
    assert set(times) == {"bucketed_ddp", "ddp", "average_gradients"}
    assert all(len(t) == summary["workload"]["repeats"] and min(t) > 0 for t in times.values())
    assert set(group["ratios"]) == {name for name, _, _, _ in ddp_peers.RATIOS}
    for name, a, b, _ in ddp_peers.RATIOS:
        ratio = group["ratios"][name]
        assert ratio["per_repeat"] == pytest.approx([x / y for x, y in zip(times[a], times[b])], rel=1e-12), name
        assert ratio["value"] == pytest.approx(statistics.median(times[a]) / statistics.median(times[b]),
                                                rel=1e-12), name
        assert group["variants"][a]["step_time_ms"] == pytest.approx(1000 * statistics.median(times[a]), rel=1e-12)
    assert len(group["memory_bytes"]) == 2
    for memory in group["memory_bytes"]:
        assert memory["formula_12P_over_N"] == 12 * -(-memory["parameters"] // 2)
        assert memory["sharded_optimizer"] == memory["formula_12P_over_N"]
        for stage in (1, 2):          # DeepSpeed may pad its partitions a little, never hold the whole state
            assert memory["formula_12P_over_N"] <= memory[f"deepspeed_zero{stage}"] < memory["replicated_adam_12P"]


def test_timeline_bubble_and_thresholds(run):
    summary = run[0]
    tl = summary["pipeline"]["timeline"]
    m, k = tl["microbatches"], tl["stages"]
    assert tl["theoretical_bubble"] == pytest.approx((k - 1) / (m + k - 1))
    tasks = [t for t in tl[f"pipeline_parallel_m{m}"]["tasks"] if t["stage"] != "backward"]
    assert sorted((t["stage"], t["microbatch"]) for t in tasks) == [(j, i) for j in range(k) for i in range(m)]
    assert tl[f"pipeline_parallel_m{m}"]["measured_bubble"] == pytest.approx(stats.measured_bubble(tasks, k))
    for variant in ("model_parallel", f"pipeline_parallel_m{m}"):   # the run drawn is the lower-median run
        runs = [r for r in run[1] if r["variant"] == variant and not r["warmup"]]
        bubbles = [stats.measured_bubble([t for t in r["timeline"] if t["stage"] != "backward"], k) for r in runs]
        assert summary["pipeline"]["variants"][variant]["measured_bubble"] == tl[variant]["measured_bubble"] \
            == statistics.median_low(bubbles)
    th = summary["thresholds"]
    if torch.cuda.device_count() < 2:
        assert not th["applicable"]
        assert th["dp_speedup"]["status"] == th["pp_speedup"]["status"] == "not_applicable"


# -- the written analysis: each value it names, the same in the console, the summary and the figures ---------

NAMES = ("step_time_ms", "speedup", "speedup_m<M>", "measured_bubble", "parameters",   # what the questions name
         "parameters_per_stage", "activations_saved_bytes")


def _benchmark_questions() -> list[str]:
    """The analysis questions a benchmark run without ``--tensor_parallel`` answers (they name the script)."""
    from grading.staff.handout import analysis

    asked = analysis.questions(("1", "2", "4"))
    return [q for qs in asked.values() for q in qs if "run_benchmarks.py" in q and "--tensor_parallel" not in q]


def _keys(node) -> set[str]:
    if isinstance(node, dict):
        return set(node).union(*(_keys(v) for v in node.values()))
    return set().union(*(_keys(v) for v in node)) if isinstance(node, list) else set()


def _drawn(summary: dict, folder: Path, monkeypatch) -> tuple[list[float], str]:
    """The bar heights and every text the benchmark's figures pass to matplotlib, drawn from ``summary``."""
    import matplotlib.axes
    import matplotlib.figure

    from project.bench import figures

    heights, texts = [], []

    def spy(cls, name, record):
        original = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, **k: (record(*a, **k), original(self, *a, **k))[1])

    spy(matplotlib.axes.Axes, "bar", lambda x, height, **_: heights.append(height))
    spy(matplotlib.axes.Axes, "barh", lambda *a, **k: None)
    spy(matplotlib.axes.Axes, "set_xticks", lambda ticks, labels=None, **_: texts.extend(labels or ()))
    spy(matplotlib.axes.Axes, "set_title", lambda label, **_: texts.append(label))
    spy(matplotlib.figure.Figure, "suptitle", lambda t, **_: texts.append(t))
    figures.draw_all(summary, folder)
    return heights, "\n".join(texts)


def test_every_value_the_analysis_names_is_the_same_in_console_summary_and_figures(run, tmp_path, monkeypatch):
    summary, _, _, _, console = run
    questions = _benchmark_questions()
    named = {t for q in questions for t in re.findall(r"`([a-z][a-z0-9_]*(?:<M>)?)`", q)}
    assert set(NAMES) <= named, f"the questions no longer name {set(NAMES) - named}"
    chunks = summary["options"]["n_chunks"]
    keys = _keys(summary)
    for name in named:   # every name a question reads is a key of the summary it points to
        for key in ([name.replace("<M>", str(m)) for m in chunks] if "<M>" in name else [name]):
            assert key in keys, f"a question names `{name}`: no {key!r} in performance_summary.json"
    lines = console.splitlines()
    heights, drawn = _drawn(summary, tmp_path, monkeypatch)

    def printed(label: str, value: str) -> None:
        assert any(re.match(rf"\s*{label}\s+{re.escape(value)}(\s|$)", line) for line in lines), (label, value)

    assert report.statistic(summary) in console and report.statistic(summary) in drawn
    printed("parameters", f"{summary['workload']['parameters']:,}")
    assert f"({summary['workload']['parameters']:,} parameters)" in drawn
    for group in ("data_parallel", "pipeline", "finetune", "ddp_zero"):
        for variant, v in summary[group]["variants"].items():
            printed(f"{variant}\\s+step_time_ms", report.ms(v["step_time_ms"]))
            if group in ("data_parallel", "pipeline") and variant not in ("comm_ours", "comm_floor",
                                                                        "capacity_sequential"):
                assert v["step_time_ms"] in heights and f"{report.ms(v['step_time_ms'])} ms" in drawn, variant
            if "measured_bubble" in v:
                bubble = f"measured_bubble {report.fraction(v['measured_bubble'])}"
                assert any(line.lstrip().startswith(variant) and bubble in line for line in lines), variant
                assert bubble in drawn or variant not in summary["pipeline"]["timeline"], variant
        for key, r in summary[group]["ratios"].items():
            printed(key, report.times(r["value"]))
            assert any(line.lstrip().startswith(key) and line.endswith(f"{report.spread(r)})") for line in lines), key
    speedup = summary["data_parallel"]["ratios"]["speedup"]
    assert f"speedup {report.times(speedup['value'])} (step_time_ms world_size_1 / world_size_2)" in drawn
    dp = summary["data_parallel"]["variants"]    # the number a reader computes from the two printed step times
    assert report.times(speedup["value"]) == report.times(dp["world_size_1"]["step_time_ms"]
                                                          / dp["world_size_2"]["step_time_ms"])
    for m in chunks:
        assert f"speedup_m{m} {report.times(summary['pipeline']['ratios'][f'speedup_m{m}']['value'])}" in drawn
    stages = summary["pipeline"]["stages"]
    assert sum(stages["parameters_per_stage"]) == summary["workload"]["parameters"]
    printed("parameters_per_stage", ", ".join(f"{n:,}" for n in stages["parameters_per_stage"]))
    assert set(stages["activations_saved_bytes"]) == {"model_parallel", *(f"pipeline_parallel_m{m}" for m in chunks)}
    for name, saved in stages["activations_saved_bytes"].items():
        assert len(saved) == 2 and min(saved) > 0, (name, saved)
        printed(name, f"{stages['micro_batches'][name]:>2} micro-batch(es): "
                + ", ".join(f"stage {j} {report.mib(b)}" for j, b in enumerate(saved)))
    theory = f"theoretical_bubble {report.fraction(summary['pipeline']['timeline']['theoretical_bubble'])}"
    assert theory in console and theory.replace("theoretical_bubble", "(K-1)/(M+K-1) =") in drawn


def test_repeats_are_numbered_from_1_in_the_log_the_summary_the_console_and_the_figures(run, tmp_path, monkeypatch):
    summary, records, _, _, console = run
    repeats = summary["workload"]["repeats"]
    assert summary["definitions"] == {"step_time_ms": stats.STEP_TIME, "ratio": stats.RATIO, "repeats": stats.REPEATS}
    assert sorted({r["repeat"] for r in records if not r["warmup"]}) == list(range(1, repeats + 1))
    assert {r["repeat"] for r in records if r["warmup"]} == {0}
    for k in range(1, repeats + 1):
        assert f"data_parallel: repeat {k}/{repeats} done" in console
    _, drawn = _drawn(summary, tmp_path, monkeypatch)
    timeline = summary["pipeline"]["timeline"]
    for variant in ("model_parallel", f"pipeline_parallel_m{timeline['microbatches']}"):
        number = summary["pipeline"]["variants"][variant]["measured_bubble_repeat"]
        assert 1 <= number <= repeats and timeline[variant]["repeat"] == number
        assert any(line.lstrip().startswith(variant) and f"(repeat {number})" in line for line in console.splitlines())
        assert f"repeats: repeat {number}, drawn)" in drawn, variant


def test_the_handout_defines_the_speedup_as_the_benchmark_does():
    """problem1.md and problem2.md say what ``stats`` computes: the quotient of two step times, each the median over
    repeats of (run time / steps); not the median of paired ratios."""
    handout = ROOT / "grading" / "staff" / "handout"
    for name, ratio in (("problem1.md", "`speedup` = `step_time_ms` of\n`world_size_1` / `step_time_ms` of "
                                        "`world_size_2`"),
                        ("problem2.md", "`speedup_m<M>` = `step_time_ms` of `model_parallel` / `step_time_ms` of "
                                        "`pipeline_parallel_m<M>`")):
        text = (handout / name).read_text()
        words = " ".join(text.split())
        assert " ".join(ratio.split()) in words, name
        assert "median over alternating repeats of (run time / steps)" in words, name
        assert "the quotient of the two step times it prints (not the median of the per-repeat ratios" in words, name
        assert "median of paired" not in words, name
    assert "the median over repeats of (run time / steps)" in stats.STEP_TIME
    assert "the quotient of two step_time_ms" in stats.RATIO
