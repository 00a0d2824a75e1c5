"""Adversarial submissions: the grader cuts each off, blames only the affected criteria, and cleans up.

Each submission is a copy of the kit with region bodies replaced (the way
``grading/kit/variants.py`` builds buggy variants). For every one: the run ends
within its (short) limits, only the criteria whose results the misbehaviour
touched lose points, the reason names what happened, and no process that the
grading started survives it (checked through a marker variable that every
rank and its children inherit). Cases run with short limits to keep the suite
lean.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import uuid
import zipfile
from pathlib import Path

import psutil
import pytest

from grading.__main__ import main as grading_main
from grading.problems import all_cases
from grading.engine.runner import run_cases
from common import ROOT
from common.process_tree import descendants
from grading.kit.intake import SubmissionError, open_submission
from grading.kit.submission import build_grading_copy
from tests.kit.launcher_probes import alive_since
from grading.kit.variants import make_variant_kit

pytestmark = pytest.mark.kit

DATASET, COMM, PIPE = "data_parallel/dataset.py", "data_parallel/comm.py", "pipeline/pipe.py"
TAG = "PYTHON_ADVERSARIAL_TEST_TAG"         # a name ranks keep (``isolation.rank_environment``)

PARTITION = """\
if size < 0 or world_size < 1:
    raise ValueError("bad arguments")
order = list(range(size))
random.Random(seed).shuffle(order)
base, extra = divmod(size, world_size)
parts, start = [], 0
for rank in range(world_size):
    length = base + (1 if rank < extra else 0)
    parts.append(order[start:start + length])
    start += length
return parts
"""
AVERAGE = """\
for param in model.parameters():
    if param.grad is not None:
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= dist.get_world_size()
"""
ONCE = "if not getattr(partition_indices, 'done_once', False):\n    partition_indices.done_once = True\n"


def once(code: str) -> str:
    """``code`` run on the first call of partition_indices only (the probe calls it many times)."""
    return ONCE + "".join("    " + line + "\n" for line in code.strip("\n").splitlines())


# ------------------------------------------------------------------------------------------ helpers
def _tagged(value: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries this test's tag."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(TAG) == value and _alive(process.pid):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def _below_this_process() -> set[int]:
    """Every live (non-zombie) process below this test process but the session's fork servers and their sessions
    (``common.forkserver``: they outlive a test): the ranks and whatever they left behind (a session adopts
    it)."""
    servers = {child.pid for child in psutil.Process().children() if _is_fork_server(child)}
    return {pid for pid in descendants(os.getpid()) if _alive(pid) and pid not in servers
            and _parent(pid) not in servers}


def _is_fork_server(process: psutil.Process) -> bool:
    try:
        return "common.forkserver" in process.cmdline()
    except psutil.Error:
        return False


def _parent(pid: int) -> int:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return 0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def no_survivors(monkeypatch, fork_servers):
    """Every process the test's grading starts inherits a tag, or (a rank forked without exec, whose start-up
    environment is its server's) is below this process; none may be alive when the test ends. The session's fork
    servers and their sessions (untagged) outlive the test; their ranks may not."""
    if fork_servers is not None:
        fork_servers.warm_up()
    value = uuid.uuid4().hex
    monkeypatch.setenv(TAG, value)
    before = _below_this_process()
    yield value
    survivors = _tagged(value) + sorted(_below_this_process() - before)
    for pid in survivors:                 # never leak, even when failing
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not survivors, f"processes started by the grading survived it: {survivors}"


@pytest.fixture
def grade_kit(fork_servers):
    """``grade_kit(tmp_path, edits, case_names, **changes)``: verdicts by criterion id for the named cases (with
    ``changes``) on a kit carrying ``edits``, the ranks forked by the session's fork servers as ``grade`` forks
    them (cold under ``GRADING_FORKSERVER=0``)."""
    def grade(tmp_path: Path, edits: list[tuple[str, str, str]], case_names: set[str], **changes) -> dict:
        kit = make_variant_kit(tmp_path / "kit", edits)
        cases = [dataclasses.replace(c, **changes) for c in all_cases() if c.name in case_names]
        assert {c.name for c in cases} == case_names
        return {v.id: v for v in run_cases(cases, kit, tmp_path / "runs", servers=fork_servers)}
    return grade


def grade_cli(tmp_path: Path, submission: Path, *args: str) -> tuple[int, dict]:
    """``python -m grading grade SUBMISSION --json ...`` in this process: (exit code, results.json)."""
    results = tmp_path / "results.json"
    code = grading_main(["grade", str(submission), "--quiet", "--json", str(results), *args])
    return code, json.loads(results.read_text())


def failed(verdicts: dict) -> set[str]:
    return {cid for cid, v in verdicts.items() if not v.passed}


# ------------------------------------------------------------------------------------------ (a) hang
def test_rank_hanging_in_a_collective_is_cut_off_with_its_stack(grade_kit, tmp_path):
    body = "if dist.get_rank() == 1:\n    dist.recv(torch.zeros(1), src=0, tag=777)   # rank 0 never sends\n" + AVERAGE
    verdicts = grade_kit(tmp_path, [(COMM, "average_gradients", body)], {"p1_comm_2rank"}, timeout_s=5)
    assert verdicts["1.2.setup"].passed, verdicts["1.2.setup"].message       # recorded before the hang
    assert failed(verdicts) == set(verdicts) - {"1.2.setup", "1.2.setup_timeout_default"}
    message = verdicts["1.2.grads_2rank"].message
    assert "timed out after" in message and "rank 1 was stuck at:" in message, message
    stuck = message.split("rank 1 was stuck at:")[1]
    assert "in recv" in stuck and "comm.py" in stuck and "in average_gradients" in stuck, message


# ------------------------------------------------------------------------------------------ (b) crash
@pytest.mark.parametrize("how, reason", [
    ("import os\nos._exit(0)", "rank 1 exited with code 0 before finishing"),
    ("import ctypes\nctypes.string_at(0)", "rank 1 died from signal SIGSEGV"),
])
def test_rank_that_exits_or_segfaults_is_reported(grade_kit, tmp_path, how, reason):
    body = "if dist.get_rank() == 1:\n" + "".join(f"    {line}\n" for line in how.splitlines()) + AVERAGE
    verdicts = grade_kit(tmp_path, [(COMM, "average_gradients", body)], {"p1_comm_2rank"}, timeout_s=20)
    assert verdicts["1.2.setup"].passed
    assert "1.2.grads_2rank" in failed(verdicts)
    messages = " ".join(v.message for v in verdicts.values())
    assert reason in messages, messages


# ------------------------------------------------------------------------------------------ (c) Pipe stage loops
def test_endless_pipe_stage_costs_problem_2_2_only(grade_kit, tmp_path):
    body = """
        batches = list(torch.split(x, self.split_size))
        for wave in schedule.clock_cycles(len(batches), len(self.stages)):
            for i, j in wave:   # stage 1 never returns
                self.workers.submit(j, lambda j=j, xb=batches[i]: self.stages[j](xb) if j == 0 else any(iter(int, 1)))
            for i, j in wave:
                batches[i] = self.workers.receive(j)
        return torch.cat(batches).to(self.devices[-1])
    """
    verdicts = grade_kit(tmp_path, [(PIPE, "forward", body)], {"p2_schedule_split", "p2_pipe"}, timeout_s=4)
    assert {cid for cid in failed(verdicts)} == {c for c in verdicts if c.startswith("2.2.")}
    message = verdicts["2.2.forward"].message
    assert "timed out after" in message and "pipe.py" in message, message


# ------------------------------------------------------------------------------------------ (d) leftovers
def test_leftover_processes_are_killed_even_after_setsid_and_there_is_no_network(grade_kit, tmp_path):
    spawn = once("""
import os, subprocess, sys, tempfile, time
path = os.path.join(tempfile.gettempdir(), "daemon")        # the rank's own folder: every other is read-only
daemon = ("import os, sys, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
          "    status = open('/proc/self/status').read().split('NSpid:')[1].split(chr(10))[0].split()[-1]\\n"
          "    open(sys.argv[1] + '.tmp', 'w').write(os.readlink('/proc/self/ns/pid') + '|' + status)\\n"
          "    os.rename(sys.argv[1] + '.tmp', sys.argv[1])\\n    time.sleep(300)")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
subprocess.Popen([sys.executable, "-c", daemon, path], start_new_session=True)
for _ in range(200):                      # until the daemon is up
    if os.path.exists(path):
        break
    time.sleep(0.05)
import socket
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    reached = "connected"
except OSError as exc:
    reached = type(exc).__name__
import json
open(path + ".net", "w").write(json.dumps([sorted(n for _, n in socket.if_nameindex()), reached]))
""")
    verdicts = grade_kit(tmp_path, [(DATASET, "partition_indices", spawn + PARTITION)], {"p1_partition"}, timeout_s=30)
    assert not failed(verdicts), {c: v.message for c, v in verdicts.items() if not v.passed}
    homes = [tmp_path / "runs" / "p1_partition" / f"rank{rank}" / "home" for rank in range(2)]
    escaped = [(home / "daemon").read_text() for home in homes if (home / "daemon").exists()]
    assert len(escaped) == 2, "the setsid daemons never started"
    for identity in escaped:    # its PID namespace and its pid there: a rank's pids are its case's
        assert not alive_since(identity), f"a daemon ({identity}) escaped with setsid and survived"
    # the autouse fixture checks that nothing else the grading started is alive
    applied = json.loads((tmp_path / "runs" / "p1_partition" / "rank0" / "sandbox.json").read_text())["applied"]
    assert {"pdeathsig", "memory_mb=8192", "open_files=4096", "file_mb=256"} <= set(applied), applied
    if os.geteuid() == 0 and "private network (loopback only)" in applied:      # root: no network at all
        for net in (home / "daemon.net" for home in homes):
            interfaces, reached = json.loads(net.read_text())
            assert interfaces == ["lo"] and reached != "connected", (interfaces, reached)


# ------------------------------------------------------------------------------------------ (e) output
def test_megabytes_of_output_do_not_change_the_verdict(grade_kit, tmp_path):
    noise = once('import sys\nsys.stdout.write("x" * 4_000_000 + "\\n")\nsys.stderr.write("y" * 4_000_000 + "\\n")')
    verdicts = grade_kit(tmp_path, [(DATASET, "partition_indices", noise + PARTITION)], {"p1_partition"}, timeout_s=30)
    assert not failed(verdicts), {c: v.message for c, v in verdicts.items() if not v.passed}
    logs = list((tmp_path / "runs" / "p1_partition").glob("rank*.stdout"))
    assert logs and all(log.stat().st_size >= 4_000_000 for log in logs)


def test_endless_output_hits_the_file_size_limit(grade_kit, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADING_FILE_MB", "8")
    flood = 'import sys\nwhile True:\n    sys.stdout.write("x" * 1_000_000)\n'
    verdicts = grade_kit(tmp_path, [(DATASET, "partition_indices", flood)], {"p1_partition"}, timeout_s=30)
    assert "File too large" in verdicts["1.1.coverage"].message, verdicts["1.1.coverage"].message
    assert verdicts["1.1.partition_class"].passed and verdicts["1.1.partition_dataset"].passed
    for log in (tmp_path / "runs" / "p1_partition").glob("rank*.std*"):
        assert log.stat().st_size <= 8 * 1024 * 1024


def test_stderr_noise_never_fails_correct_work(grade_kit, tmp_path):
    noise = """
import sys, warnings
warnings.warn("this looks alarming but is only a warning")
sys.stderr.write("[W socket.cpp:663] [c10d] The client socket has failed to connect\\n"
                 "Traceback (most recent call last):\\nRuntimeError: NCCL error (this line is only printed)\\n" * 20)
print("ERROR FAILED assert", flush=True)
"""
    verdicts = grade_kit(tmp_path, [(COMM, "average_gradients", noise + AVERAGE)], {"p1_comm_2rank"})
    assert not failed(verdicts), {c: v.message for c, v in verdicts.items() if not v.passed}
    assert "Traceback" in (tmp_path / "runs" / "p1_comm_2rank" / "rank0.stderr").read_text()


# ------------------------------------------------------------------------------------------ (f) monkeypatching
def test_patched_comparisons_and_grader_modules_change_nothing(grade_kit, tmp_path):
    cheat = """
import torch.testing
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
import grading.kit.compare, grading.engine.runner, grading.engine.rubric
grading.kit.compare.assert_tensor_close = lambda *args, **kwargs: None
grading.kit.compare.assert_state_close = lambda *args, **kwargs: None
grading.engine.runner.expect = lambda *args, **kwargs: None
grading.engine.rubric.CheckFailed = Warning
for param in model.parameters():        # wrong: summed, never divided
    if param.grad is not None:
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
"""
    verdicts = grade_kit(tmp_path, [(COMM, "average_gradients", cheat)], {"p1_comm_2rank"}, timeout_s=30)
    assert failed(verdicts) == {"1.2.grads_2rank"}
    assert "differs from the reference" in verdicts["1.2.grads_2rank"].message
    report = build_grading_copy(ROOT, tmp_path / "kit", tmp_path / "copy")
    assert any("average_gradients" in note and "torch.allclose =" in note for note in report.suspicious)
    assert any(note.startswith("flagged for staff review") for note in report.notes())
    assert "reaches into the grader ('grading')" in report.refused["1.2"]     # and the course scores 1.2 zero


# ------------------------------------------------------------------------------------------ (g) fake results
def test_planted_and_altered_result_files_are_rejected(grade_kit, tmp_path):
    # The grader-access rule (a region that names the grader scores zero) is static, so a determined cheater
    # hides the import; the signed result files must still reject what it plants.
    hidden = ("from grading.problems.p1_2_comm import reference as p1\n"
              "torch.save(p1.serial_gradients(seed=0, step=0), rank_dir / 'grads.pt')\n"
              "torch.save({'losses': [0.0], 'params': p1.params_of(p1.GradProbeNet(seed=0))}, "
              "rank_dir / 'train_step.pt')\n").encode().hex()
    plant = f"""
import sys
from pathlib import Path
import torch
rank_dir = Path(sys.argv[1]).parent / f"rank{{sys.argv[2]}}"
exec(bytes.fromhex("{hidden}").decode())     # the right answers, recorded already
with open(rank_dir / "parts.log", "a") as log:
    log.write('{{"name": "train_step", "kind": "pt", "sha256": "00", "mac": "00"}}\\n')
(rank_dir / "done").write_text("ok")
import os
os._exit(0)
"""
    edits = [(COMM, "average_gradients", "for param in model.parameters():\n    if param.grad is not None:\n"
                                         "        dist.all_reduce(param.grad)\n"),        # wrong: not divided
             (COMM, "train_step", plant)]
    verdicts = grade_kit(tmp_path, edits, {"p1_comm_2rank"}, timeout_s=30)
    assert verdicts["1.2.setup"].passed
    assert "changed or removed after the probe recorded it" in verdicts["1.2.grads_2rank"].message
    assert "not written by the grader's probe" in verdicts["1.2.train_step_updates"].message
    assert "exited with code 0 before finishing" in verdicts["1.2.train_step_updates"].message   # fake 'done'
    report = build_grading_copy(ROOT, tmp_path / "kit", tmp_path / "copy")
    assert any("train_step" in note and "sys.argv" in note for note in report.suspicious), report.suspicious


# ------------------------------------------------------------------------------------------ (h) outside the regions
def test_edits_outside_regions_and_to_the_provided_runtime_are_ignored(tmp_path):
    submission = make_variant_kit(tmp_path / "sub", [])
    runtime = submission / "pipeline" / "runtime.py"
    runtime.write_text('raise SystemExit("the submission replaced the provided runtime")\n' + runtime.read_text())
    comm = submission / COMM
    comm.write_text(comm.read_text().replace("def average_gradients(", "def average_gradients_hacked("))
    (submission / "pipeline" / "helper.py").write_text("X = 1\n")
    report = build_grading_copy(ROOT, submission, tmp_path / "copy")
    assert (tmp_path / "copy" / "pipeline" / "runtime.py").read_text() == (ROOT / "pipeline/runtime.py").read_text()
    assert "def average_gradients(" in (tmp_path / "copy" / COMM).read_text()
    assert report.provided_changed == ["pipeline/runtime.py"] and report.tampered == [COMM]
    assert report.extra_files == ["pipeline/helper.py"]
    code, results = grade_cli(tmp_path, submission, "--problem", "2.1", "--timeout", "30")
    assert code == 0 and results["score"] == results["max_score"] > 0        # the kit's runtime was imported
    for note in ("changed provided file (ignored; the kit's copy was used): pipeline/runtime.py",
                 f"changed outside the student regions (ignored; the kit's text was used): {COMM}",
                 "file not in the kit (ignored; only region bodies are graded): pipeline/helper.py"):
        assert note in results["output"]


# ------------------------------------------------------------------------------------------ (i) import failures
def test_syntax_error_and_missing_file_cost_only_their_problem(tmp_path, fork_servers):
    kit = make_variant_kit(tmp_path / "kit", [(DATASET, "partition_indices", "return [[0] +\n")])
    (kit / COMM).unlink()
    report = build_grading_copy(ROOT, kit, tmp_path / "copy")
    assert report.missing_files == [COMM]
    assert len(report.syntax_errors) == 1 and report.syntax_errors[0].startswith(DATASET + ":")
    cases = [dataclasses.replace(c, timeout_s=30, world_size=1) for c in all_cases()
             if c.name in {"p1_partition", "p1_comm_2rank"}]
    verdicts = {v.id: v for v in run_cases(cases, tmp_path / "copy", tmp_path / "runs", servers=fork_servers)}
    for cid, verdict in verdicts.items():
        assert not verdict.passed
        if cid.startswith("1.1."):
            assert verdict.status == "failed" and "SyntaxError" in verdict.message, verdict.message
        else:
            assert verdict.status == "not_implemented" and "Problem 1.2" in verdict.message, verdict.message


# ------------------------------------------------------------------------------------------ (j) wrong values
@pytest.mark.parametrize("extra, reason", [
    ("param.grad.fill_(float('nan'))", "contains NaN or Inf"),
    ("param.grad.data = param.grad.data.flatten()", "shape (48,), expected (8, 6)"),
    ("param.grad.data = param.grad.data.double()", "dtype torch.float64, expected torch.float32"),
], ids=["nan", "shape", "dtype"])
def test_wrong_shape_dtype_or_nan_is_named(grade_kit, tmp_path, extra, reason):
    edits = [(COMM, "average_gradients", AVERAGE + "        " + extra + "\n")]
    verdicts = grade_kit(tmp_path, edits, {"p1_comm_2rank"}, world_size=1, args={"train_step": False}, timeout_s=30)
    assert reason in verdicts["1.2.grads_2rank"].message, verdicts["1.2.grads_2rank"].message
    assert all(verdicts[c].passed for c in ("1.2.setup", "1.2.unused_grads_none", "1.2.uses_all_reduce"))


def test_result_on_the_wrong_device_is_named(grade_kit, tmp_path):
    body = ("optimizer.zero_grad()\nloss = loss_fn(model(inputs), targets)\nloss.backward()\n"
            "average_gradients(model)\noptimizer.step()\nreturn loss.detach().to('meta')\n")
    verdicts = grade_kit(tmp_path, [(COMM, "train_step", body)], {"p1_comm_2rank"}, world_size=1, timeout_s=30)
    assert "on meta, expected a Python float" in verdicts["1.2.train_step_loss"].message
    assert verdicts["1.2.train_step_updates"].passed


# ------------------------------------------------------------------------------------------ reports always written
def test_a_crashing_grader_still_writes_results_json(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the grader")
    monkeypatch.setattr("grading.commands.grade.run_cases", broken)
    code, results = grade_cli(tmp_path, make_variant_kit(tmp_path / "sub", []), "--problem", "1.1")
    assert code == 4
    assert "score" not in results and results["max_score"] > 0      # nothing judged: blank (finalize gives 0)
    assert "a bug in the grader" in results["output"]                # the traceback, once, at the top
    assert all("skipped: the grader failed" in t["output"] and "Traceback" not in t["output"]
               for t in results["tests"])                             # hidden ones too: nothing of their inputs


def test_a_rejected_submission_still_gets_a_full_report(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../../escape.py", "x = 1")
    code, results = grade_cli(tmp_path, archive)
    assert code == 2 and results["score"] == 0 and results["max_score"] > 0
    assert all("unsafe path" in t["output"] for t in results["tests"])


# ------------------------------------------------------------------------------------------ intake
def _student_tree(root: Path) -> Path:
    for rel in (DATASET, COMM):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((ROOT / rel).read_text())
    return root


def _zip(path: Path, members: dict[str, str], symlink: str | None = None, encrypted: str | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if name == symlink:
                info.external_attr = (0o120777 << 16)
            z.writestr(info, text)
    if encrypted:             # zipfile cannot encrypt: set the "encrypted" bit in both headers by hand
        data = bytearray(path.read_bytes())
        for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            at = data.index(signature)
            data[at + offset] |= 0x1
        path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("members, kwargs, message", [
    ({"../../escape.py": "x"}, {}, "unsafe path"),
    ({"/etc/escape.py": "x"}, {}, "unsafe path"),
    ({"a5/data_parallel/comm.py": "/etc/passwd"}, {"symlink": "a5/data_parallel/comm.py"}, "symlink"),
    ({"a5/data_parallel/comm.py": "x"}, {"encrypted": "a5/data_parallel/comm.py"}, "encrypted"),
    ({"a/data_parallel/comm.py": "x", "b/data_parallel/comm.py": "x"}, {}, "ambiguous layout"),
    ({"notes.txt": "x"}, {}, "no student file found"),
], ids=["zip_slip", "absolute", "symlink", "encrypted", "ambiguous", "empty"])
def test_bad_zips_are_rejected_with_a_clear_message(tmp_path, members, kwargs, message):
    archive = _zip(tmp_path / "s.zip", members, **kwargs)
    with pytest.raises(SubmissionError, match=message):
        open_submission(archive, ROOT, tmp_path / "scratch")


def test_absurd_sizes_are_rejected(tmp_path, monkeypatch):
    (tmp_path / "junk.zip").write_bytes(os.urandom(2000))
    with pytest.raises(SubmissionError, match="not a readable zip"):
        open_submission(tmp_path / "junk.zip", ROOT, tmp_path / "scratch")
    monkeypatch.setattr("grading.kit.intake.MAX_ZIP_BYTES", 1000)
    archive = _zip(tmp_path / "big.zip", {"a5/data_parallel/comm.py": "#" * 5000})
    with pytest.raises(SubmissionError, match="uncompressed"):
        open_submission(archive, ROOT, tmp_path / "scratch")
    monkeypatch.setattr("grading.kit.intake.MAX_ZIP_MEMBERS", 3)
    archive = _zip(tmp_path / "many.zip", {f"a5/f{k}.txt": "x" for k in range(4)})
    with pytest.raises(SubmissionError, match="members"):
        open_submission(archive, ROOT, tmp_path / "scratch")
    folder = _student_tree(tmp_path / "tree")
    for k in range(30):
        (folder / f"f{k}.txt").write_text("x")
    monkeypatch.setattr("grading.kit.intake.MAX_TREE_ENTRIES", 20)
    with pytest.raises(SubmissionError, match="more than 20 files"):
        open_submission(folder, ROOT, tmp_path / "scratch")


def test_oversized_student_file_is_graded_as_not_implemented(tmp_path, monkeypatch):
    folder = _student_tree(tmp_path / "tree")
    (folder / COMM).write_text((folder / COMM).read_text() + "#" * 2000)
    monkeypatch.setattr("grading.kit.submission.MAX_STUDENT_FILE_BYTES", 1000)
    report = build_grading_copy(ROOT, open_submission(folder, ROOT, tmp_path), tmp_path / "copy")
    assert any(COMM in m and "larger than 1000 bytes" in m for m in report.malformed), report.malformed


@pytest.mark.parametrize("link", ["data_parallel", "data_parallel/comm.py"])
def test_symlinks_out_of_a_folder_submission_are_rejected(tmp_path, link):
    folder = _student_tree(tmp_path / "sub")
    if (folder / link).is_file():
        (folder / link).unlink()
    else:
        shutil.rmtree(folder / link)
    os.symlink(ROOT / link, folder / link)           # e.g. at the reference solution
    (folder / "pipeline").mkdir()
    (folder / "pipeline" / "pipe.py").write_text((ROOT / PIPE).read_text())
    with pytest.raises(SubmissionError, match="is a symlink .*outside the submission"):
        open_submission(folder, ROOT, tmp_path / "scratch")


def test_macos_metadata_and_virtualenvs_are_not_ambiguous(tmp_path):
    folder = _student_tree(tmp_path / "sub" / "a5")
    _student_tree(tmp_path / "sub" / "__MACOSX" / "a5")
    (folder / ".venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", folder / ".venv" / "bin" / "python")
    _student_tree(folder / ".venv" / "lib" / "site-packages" / "old")
    assert open_submission(tmp_path / "sub", ROOT, tmp_path / "scratch") == folder
