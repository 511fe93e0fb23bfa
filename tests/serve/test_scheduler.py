"""The batch scheduler in-process, with a recording runner: padding, splitting, order, limits."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kiln.serve.batching import BatchScheduler, DirectExecutor
from kiln.serve.config import BatchingOptions, ConfigError
from kiln.serve.status import DeadlineExceeded, InvalidArgument, Unavailable


class Recorder:
    """A runner that doubles ``x`` and records every batch it was given."""

    def __init__(self, gate: threading.Event | None = None):
        self.batches = []
        self.gate = gate

    def new_runner(self):
        def run(key, feeds):
            if self.gate is not None:
                self.gate.wait(10)
            self.batches.append({n: a.copy() for n, a in feeds.items()})
            return {"y": feeds["x"] * 2.0, "n": np.arange(len(feeds["x"]))}

        return run


def far() -> float:
    return time.monotonic() + 30


def submit_all(scheduler, arrays, key="serving_default"):
    return [scheduler.submit(key, {"x": a}, far()) for a in arrays]


def test_rows_are_padded_with_the_first_tasks_first_row_and_sliced_back_in_order():
    rec = Recorder(threading.Event())
    s = BatchScheduler(BatchingOptions(max_batch_size=8, batch_timeout_micros=10_000, num_batch_threads=1,
                                       allowed_batch_sizes=(4, 8)), rec.new_runner)
    xs = [np.full((1, 2), 1.0), np.full((2, 2), 2.0), np.full((2, 2), 3.0)]
    requests = submit_all(s, xs)
    rec.gate.set()
    results = [r.future.result(10) for r in requests]
    s.close()
    (batch,) = rec.batches
    assert batch["x"].shape == (8, 2)  # 5 rows padded up to the allowed size 8
    np.testing.assert_array_equal(batch["x"][5:], np.full((3, 2), 1.0))  # copies of task 0, row 0
    for x, got in zip(xs, results):
        np.testing.assert_array_equal(got["y"], x * 2)
    assert [list(r["n"]) for r in results] == [[0], [1, 2], [3, 4]]


def test_a_large_request_is_split_to_fill_the_open_batch_and_reassembled():
    rec = Recorder(threading.Event())
    s = BatchScheduler(BatchingOptions(max_batch_size=16, max_execution_batch_size=4, num_batch_threads=1,
                                       enable_large_batch_splitting=True, batch_timeout_micros=200_000),
                       rec.new_runner)
    first = np.zeros((3, 1))
    big = np.arange(9, dtype=float).reshape(9, 1)
    r1, r2 = submit_all(s, [first, big])
    rec.gate.set()
    out = r2.future.result(10)
    r1.future.result(10)
    s.close()
    assert [b["x"].shape[0] for b in rec.batches] == [4, 4, 4]  # 3 + 1 split off, then 4 and 4
    np.testing.assert_array_equal(out["y"], big * 2)


def test_without_splitting_a_task_larger_than_max_batch_size_is_refused():
    s = BatchScheduler(BatchingOptions(max_batch_size=4, num_batch_threads=1), Recorder().new_runner)
    with pytest.raises(InvalidArgument, match="Task size 5 is larger than maximum input batch size 4"):
        s.submit("k", {"x": np.zeros((5, 1))}, far())
    with pytest.raises(InvalidArgument, match="equal 0th-dimension size"):
        s.submit("k", {"x": np.zeros((2, 1)), "z": np.zeros((3, 1))}, far())
    s.close()


def test_a_full_queue_refuses_at_once_and_accepted_tasks_still_run():
    gate = threading.Event()
    rec = Recorder(gate)
    s = BatchScheduler(BatchingOptions(max_batch_size=2, max_enqueued_batches=1, num_batch_threads=1,
                                       batch_timeout_micros=0), rec.new_runner)
    running = s.submit("k", {"x": np.ones((2, 1))}, far())  # taken by the worker, blocked on the gate
    for _ in range(100):
        if not s.queued:
            break
        time.sleep(0.01)
    queued = s.submit("k", {"x": np.ones((2, 1))}, far())
    with pytest.raises(Unavailable, match="is full; currently 1 batches enqueued and max_enqueued_batches is 1"):
        s.submit("k", {"x": np.ones((1, 1))}, far())
    gate.set()
    assert running.future.result(10)["y"].shape == (2, 1)
    assert queued.future.result(10)["y"].shape == (2, 1)
    s.close()
    assert s.calls == 2


def test_signatures_and_shapes_get_separate_batches_unless_padding_is_on():
    rec = Recorder(threading.Event())
    s = BatchScheduler(BatchingOptions(max_batch_size=8, num_batch_threads=1, batch_timeout_micros=10_000),
                       rec.new_runner)
    a = s.submit("one", {"x": np.ones((1, 2))}, far())
    b = s.submit("two", {"x": np.ones((1, 2))}, far())
    c = s.submit("one", {"x": np.ones((1, 3))}, far())
    rec.gate.set()
    for r in (a, b, c):
        r.future.result(10)
    s.close()
    assert sorted(batch["x"].shape for batch in rec.batches) == [(1, 2), (1, 2), (1, 3)]

    rec = Recorder(threading.Event())
    s = BatchScheduler(BatchingOptions(max_batch_size=8, num_batch_threads=1, batch_timeout_micros=10_000,
                                       pad_variable_length_inputs=True), rec.new_runner)
    short, long = s.submit("k", {"x": np.full((1, 2), 5.0)}, far()), s.submit("k", {"x": np.ones((1, 3))}, far())
    rec.gate.set()
    assert short.future.result(10)["y"].tolist() == [[10.0, 10.0, 10.0]]  # padded with its first element
    long.future.result(10)
    s.close()
    assert [batch["x"].shape for batch in rec.batches] == [(2, 3)]


def test_a_request_past_its_deadline_is_dropped_from_its_batch():
    rec = Recorder(threading.Event())
    s = BatchScheduler(BatchingOptions(max_batch_size=8, num_batch_threads=1, batch_timeout_micros=10_000),
                       rec.new_runner)
    late = s.submit("k", {"x": np.zeros((1, 1))}, time.monotonic() - 1)
    on_time = s.submit("k", {"x": np.ones((1, 1))}, far())
    rec.gate.set()
    assert on_time.future.result(10)["y"].tolist() == [[2.0]]
    with pytest.raises(DeadlineExceeded):
        late.future.result(10)
    s.close()
    assert [b["x"].shape[0] for b in rec.batches] == [1]


def test_close_drains_what_is_queued_and_then_refuses():
    rec = Recorder()
    s = BatchScheduler(BatchingOptions(max_batch_size=8, num_batch_threads=2, batch_timeout_micros=5_000_000),
                       rec.new_runner)
    requests = submit_all(s, [np.ones((1, 1))] * 5)
    s.close(drain=True)  # does not wait the 5 s timeout
    assert all(r.future.result(0)["y"].tolist() == [[2.0]] for r in requests)
    with pytest.raises(Unavailable, match="shutting down"):
        s.submit("k", {"x": np.ones((1, 1))}, far())


def test_a_backend_failure_fails_every_request_of_the_batch_once_each_with_its_own_run():
    def new_runner():
        def run(key, feeds):
            raise RuntimeError("kernel exploded")
        return run

    s = BatchScheduler(BatchingOptions(max_batch_size=4, num_batch_threads=1, batch_timeout_micros=20_000), new_runner)
    requests = submit_all(s, [np.ones((1, 1))] * 3)
    for r in requests:
        with pytest.raises(InvalidArgument, match="the model failed on this request's input.s. 'x': RuntimeError: "
                                                  "kernel exploded"):
            r.future.result(10)
    s.close()


def test_direct_executor_gives_each_thread_its_own_runner():
    made = []

    def new_runner():
        made.append(threading.get_ident())
        return lambda key, feeds: {"y": feeds["x"] + 1}

    ex = DirectExecutor(new_runner, threads=2)
    requests = [ex.submit("k", {"x": np.full((1,), i)}, far()) for i in range(20)]
    assert [r.future.result(10)["y"].tolist() for r in requests] == [[i + 1] for i in range(20)]
    ex.close()
    assert len(made) == len(set(made)) <= 2 and ex.calls == 20


@pytest.mark.parametrize("params, message", [
    (dict(max_batch_size=0), "max_batch_size must be >= 1"),
    (dict(max_batch_size=8, allowed_batch_sizes=(4, 2, 8)), "monotonically increasing"),
    (dict(max_batch_size=8, allowed_batch_sizes=(2, 4)), "final entry in allowed_batch_sizes must equal max_batch_size"),
    (dict(max_batch_size=8, batch_timeout_micros=-1), "batch_timeout_micros must be >= 0"),
])
def test_inconsistent_batching_parameters_are_refused(params, message):
    with pytest.raises(ConfigError, match=message):
        BatchingOptions(**params)


def test_every_worker_warms_up_before_the_scheduler_takes_requests():
    warmed = []
    s = BatchScheduler(BatchingOptions(max_batch_size=4, num_batch_threads=3), Recorder().new_runner,
                       warmup=lambda runner: warmed.append(runner("k", {"x": np.zeros((4, 1))})["y"].shape))
    assert warmed == [(4, 1)] * 3  # done by the time the constructor returns
    s.close()
