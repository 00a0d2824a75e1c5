"""What ``pipeline.runtime`` and ``ModelParallel`` record stays a list to its readers, bounded in memory."""
from __future__ import annotations

import threading

import pytest
import torch

from pipeline import runtime
from pipeline.gpt2 import ModelParallel

pytestmark = pytest.mark.kit


def test_record_list_slices_compares_and_stays_bounded():
    records = runtime.RecordList(limit=100)
    for i in range(1000):
        records.append(i)
    assert isinstance(records, list)
    assert 100 <= len(records) <= 110 and records[-1] == 999
    assert records[:3] == list(range(records[0], records[0] + 3))           # slicing gives a list
    assert records == list(range(1000 - len(records), 1000))                 # == a plain list, most recent kept
    records.clear()
    assert records == []


def test_record_list_append_from_threads_loses_nothing_below_the_limit():
    records = runtime.RecordList(limit=10_000)
    threads = [threading.Thread(target=lambda k=k: [records.append((k, i)) for i in range(1000)]) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(records) == sorted((k, i) for k in range(4) for i in range(1000))


def test_workers_events_slice_like_a_list_and_autocast_reaches_the_worker():
    with runtime.StageWorkers(["cpu", "cpu"]) as workers:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            workers.submit(0, lambda: torch.ones(2, 2) @ torch.ones(2, 2))
        workers.submit(1, lambda: torch.ones(2, 2) @ torch.ones(2, 2))
        inside, outside = workers.receive(0), workers.receive(1)
        assert workers.events[:2] == [("submit", 0), ("submit", 1)]
        assert workers.events == [("submit", 0), ("submit", 1), ("receive", 0), ("receive", 1)]
        assert [t["stage"] for t in sorted(workers.timeline, key=lambda t: t["stage"])] == [0, 1]
    assert (inside.dtype, outside.dtype) == (torch.bfloat16, torch.float32)


def test_model_parallel_keeps_the_same_timeline_as_the_pipe_workers():
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    net = ModelParallel(stages, ["cpu", "cpu"])
    for _ in range(3):
        net(torch.randn(5, 4))
    assert isinstance(net.timeline, runtime.RecordList)
    assert [(t["stage"], t["task_index"]) for t in net.timeline] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert all(t["end"] >= t["start"] for t in net.timeline)
    assert net.timeline[0]["end"] <= net.timeline[1]["start"]               # one stage after the other
