"""The converted model in TensorFlow: batching under concurrent requests, a full queue, XLA compiles."""

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from kiln.inference import convert as _convert  # noqa: E402

from . import models  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def convert(src, out, options=""):
    """Float32 placement and batching (part 1); bfloat16 and buckets are tested in test_part2.py."""
    return _convert(src, out, options + "\nbfloat16_optimization: DISABLED\nio_shape_optimization: DISABLED\n")


def _counting(path):
    m = models.Counting()
    return models.save_module(m, path, {"serving_default": m.serve.get_concrete_function(),
                                        "stats": m.stats.get_concrete_function()}, {"body": m.body})


def _concurrent(fn, feeds, timeout=60):
    results, errors = [None] * len(feeds), []
    barrier = threading.Barrier(len(feeds))

    def worker(i):
        barrier.wait()
        try:
            results[i] = fn(feeds[i])
        except Exception as exc:  # collected: the test asserts on them
            errors.append(str(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results, errors


def test_concurrent_single_rows_are_batched_with_correct_results(tmp_path):
    src = _counting(tmp_path / "counting")
    out = tmp_path / "out"
    convert(src, str(out), 'tpu_functions { function_alias: "body" }\n'
                           "batch_options { num_batch_threads: 1 max_batch_size: 8 batch_timeout_micros: 200000 "
                           "allowed_batch_sizes: 2 allowed_batch_sizes: 4 allowed_batch_sizes: 8 }")
    loaded = tf.saved_model.load(str(out))
    serve, stats = loaded.signatures["serving_default"], loaded.signatures["stats"]
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    feeds = [np.full((1, 4), i, np.float32) for i in range(16)]
    results, errors = _concurrent(lambda x: serve(x=tf.constant(x))["y"].numpy(), feeds)
    assert not errors
    for x, y in zip(feeds, results):
        np.testing.assert_allclose(y, x @ w, rtol=1e-6)
    s = {k: int(v.numpy()) for k, v in stats().items()}
    assert s["calls"] < 16 and s["biggest"] <= 8
    assert s["rows"] >= 16 and s["rows"] % 2 == 0  # padded to the 2/4/8 buckets


def test_full_queue_fails_fast_with_unavailable(tmp_path):
    class Slow(tf.Module):
        @tf.function
        def body(self, x):
            def step(i, acc):
                return i + 1, tf.tanh(tf.matmul(acc, acc) * 1e-3)

            _, acc = tf.while_loop(lambda i, a: i < 1500, step, [0, tf.ones([96, 96])])
            return x + tf.reduce_sum(acc) * 0.0

        @tf.function(input_signature=[models.SPEC])
        def serve(self, x):
            return {"y": self.body(x)}

    m = Slow()
    src = models.save_module(m, tmp_path / "slow", {"serving_default": m.serve.get_concrete_function()},
                             {"body": m.body})
    out = tmp_path / "out"
    convert(src, str(out), "batch_options { num_batch_threads: 1 max_batch_size: 1 max_enqueued_batches: 1 "
                           "batch_timeout_micros: 0 experimental { function_alias: \"body\" } }")
    serve = tf.saved_model.load(str(out)).signatures["serving_default"]
    serve(x=tf.ones([1, 4]))
    results, errors = _concurrent(lambda x: serve(x=tf.constant(x))["y"].numpy(),
                                  [np.ones((1, 4), np.float32)] * 12)
    assert errors, "a queue of one batch must reject some of 12 concurrent requests"
    assert all("The batch scheduling queue to which this task was submitted is full" in e for e in errors)
    assert sum(r is not None for r in results) >= 1


_XLA_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf
    loaded = tf.saved_model.load(sys.argv[1])
    for key, rows in json.loads(sys.argv[2]):
        loaded.signatures[key](x=tf.ones([rows, 4]))
""")


def _xla_modules(model_dir, calls, dump):
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", _XLA_PROBE, str(model_dir), json.dumps(calls)], env=env, check=True,
                   capture_output=True, timeout=240)
    return sorted({p.name.split(".")[1] for p in Path(dump).glob("module_*.before_optimizations.txt")}), \
        sorted(p.read_text() for p in Path(dump).glob("module_*.before_optimizations.txt"))


@pytest.mark.slow  # an XLA dump in a subprocess (buckets are counted in the fast lane: test_part2.py)
def test_xla_compiles_the_selected_functions_only_and_each_bucket(tmp_path):
    src = models.save_two(tmp_path / "two")
    out = tmp_path / "out"
    convert(src, str(out), 'tpu_functions { function_alias: "func_a" }' +
            "batch_options { max_batch_size: 8 batch_timeout_micros: 0 allowed_batch_sizes: 2 "
            "allowed_batch_sizes: 4 allowed_batch_sizes: 8 }")
    names, texts = _xla_modules(out, [["serve_a", 1], ["serve_a", 3], ["serve_a", 7], ["serve_b", 5]],
                                tmp_path / "dump")
    assert names and all("func_a" in n for n in names), names
    # one compile per bucket: the entry's first parameter is f32[2,4], f32[4,4], f32[8,4] (1, 3, 7 rows padded)
    rows = [re.search(r"ENTRY[^\n]*?\([\w.]+: f32\[(\d+),4\]", t).group(1) for t in texts]
    assert sorted(rows, key=int) == ["2", "4", "8"], rows
    # the input model compiles nothing
    names_in, _ = _xla_modules(src, [["serve_a", 1], ["serve_b", 1]], tmp_path / "dump_in")
    assert names_in == []

