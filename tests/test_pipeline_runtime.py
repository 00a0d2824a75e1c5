"""The provided pipeline runtime (``pipeline/runtime.py``: StageWorkers), tested directly (kit tests, no spawn)."""
import pytest

def _failing_task():
    raise KeyError("stage task failed")


@pytest.mark.kit
def test_stage_workers_carry_grad_mode_and_record_events():
    import torch

    from pipeline.runtime import StageWorkers
    with StageWorkers(["cpu", "cpu"]) as workers:
        assert [t.is_alive() for t in workers.threads] == [True, True]
        with torch.no_grad():
            workers.submit(0, torch.is_grad_enabled)
        workers.submit(1, torch.is_grad_enabled)
        assert workers.receive(0) is False and workers.receive(1) is True
        assert list(workers.events) == [("submit", 0), ("submit", 1), ("receive", 0), ("receive", 1)]
        assert sorted((t["stage"], t["task_index"]) for t in workers.timeline) == [(0, 0), (1, 0)]
        assert all(t["start"] <= t["end"] for t in workers.timeline)
    assert not any(t.is_alive() for t in workers.threads)
    workers.close()                                    # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        workers.submit(0, lambda: None)


@pytest.mark.kit
def test_stage_workers_reraise_with_worker_traceback_and_stay_usable():
    import traceback

    from pipeline.runtime import StageWorkers
    with StageWorkers(["cpu", "cpu"]) as workers:
        workers.submit(0, _failing_task)
        workers.submit(1, lambda: "dropped")           # outstanding when stage 0 fails: drained
        with pytest.raises(KeyError, match="stage task failed") as info:
            workers.receive(0)
        text = "".join(traceback.format_exception(info.value))
        assert "_failing_task" in text and "pipeline stage 0" in text
        workers.submit(1, lambda: "fresh")
        assert workers.receive(1) == "fresh"
        with pytest.raises(RuntimeError, match="nothing was submitted"):
            workers.receive(0)


@pytest.mark.kit
def test_stage_workers_receive_times_out_naming_the_stage():
    import threading

    from pipeline.runtime import StageWorkers
    release = threading.Event()
    with StageWorkers(["cpu", "cpu"], timeout=0.2) as workers:
        workers.submit(1, release.wait)
        with pytest.raises(TimeoutError, match="stage 1"):
            workers.receive(1)
        release.set()


@pytest.mark.kit
def test_forgotten_pipe_stops_its_threads():
    import gc

    from torch import nn

    from pipeline.pipe import Pipe
    pipe = Pipe([nn.Identity(), nn.Identity()], ["cpu", "cpu"], 2)
    threads = list(pipe.workers.threads)
    del pipe
    gc.collect()
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.kit
def test_a_task_reads_the_callers_variables_as_they_are_at_receive_on_every_run():
    """Tasks start only at the caller's receive: a late-reading task (the bug 2.2's docstring rules out) reads
    the loop's last values on every run, not whatever the threads' timing leaves."""
    from pipeline.runtime import StageWorkers
    box = {"k": -1}
    with StageWorkers(["cpu", "cpu", "cpu"]) as workers:
        for _ in range(20):
            for k in range(3):
                box["k"] = k
                workers.submit(k, lambda: box["k"])
            box["k"] = 9
            assert [workers.receive(k) for k in range(3)] == [9, 9, 9]
