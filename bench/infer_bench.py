"""Inference converter: conversion time by stage, placed-function latency, and serving throughput.

First the conversion itself, on the MLP below (and with ``--mobilenet`` on a Keras Applications
MobileNetV2 with random weights): wall time of each stage with the accuracy guard on and with
``skip_accuracy_check``, the two alternating for ``--rounds`` rounds (median per stage), and the
latency of each placed function before and after as the conversion report measured it.

Then serving: throughput of 32 concurrent single-row clients, input model vs converted.

Variants (float32): the input SavedModel (TensorFlow ops), XLA only, in-graph batching only, XLA +
batching; then the XLA compile count per batch bucket of the XLA + batching model (read from an
``XLA_FLAGS=--xla_dump_to`` dump in a child process). On CPU, batching mostly adds queueing
(inference.md E1f): its gain is an accelerator property; this measures, it does not promise.
Then precision: the XLA function in float32, bfloat16 and int8 (static range, TensorFlow's
quantizer, 200 calibration samples), each as single-row clients and as one client sending
``--rows``-row requests, with the error the conversion report measured.

    .venv/bin/python bench/infer_bench.py [--rounds 3] [--mobilenet] [--clients 32] [--requests 20] [--width 512]
        [--rows 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

F32 = " bfloat16_optimization: DISABLED io_shape_optimization: DISABLED"
BATCHING = ("batch_options {{ num_batch_threads: 2 max_batch_size: 32 batch_timeout_micros: 2000 "
            "allowed_batch_sizes: 8 allowed_batch_sizes: 16 allowed_batch_sizes: 32 {target} }}")


def build(path: Path, width: int) -> str:
    import tensorflow as tf

    class Mlp(tf.Module):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.ws = [tf.Variable((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32))
                       for _ in range(4)]

        @tf.function
        def body(self, x):
            for w in self.ws:
                x = tf.nn.relu(tf.matmul(x, w))
            return x

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32)])
        def serve(self, x):
            return {"y": self.body(x)}

    m = Mlp()
    tf.saved_model.save(m, str(path), signatures={"serving_default": m.serve.get_concrete_function()},
                        options=tf.saved_model.SaveOptions(function_aliases={"body": m.body}))
    return str(path)


def throughput(model_dir: str, width: int, clients: int, requests: int) -> float:
    import tensorflow as tf

    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    x = tf.ones([1, width])
    for _ in range(3):
        serve(x=x)  # compile / warm
    barrier = threading.Barrier(clients + 1)

    def client():
        barrier.wait()
        for _ in range(requests):
            serve(x=x)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return clients * requests / (time.perf_counter() - start)


_COUNT = """
import sys, threading, tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
width, clients = int(sys.argv[2]), int(sys.argv[3])
def client(rows):
    serve(x=tf.ones([rows, width]))
threads = [threading.Thread(target=client, args=(1 + i % 3,)) for i in range(clients)]
[t.start() for t in threads]; [t.join() for t in threads]
"""


def compiles_per_bucket(model_dir: str, width: int, clients: int) -> dict:
    import re

    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump}", PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, "-c", _COUNT, model_dir, str(width), str(clients)], env=env, check=True)
        rows = Counter()
        for p in Path(dump).glob("module_*.before_optimizations.txt"):
            m = re.search(r"ENTRY[^\n]*?\([\w.]+: f32\[(\d+),", p.read_text())
            if m:
                rows[int(m.group(1))] += 1
    return dict(sorted(rows.items()))


def rows_per_second(serve, width: int, rows: int, seconds: float = 1.0) -> float:
    import tensorflow as tf

    x = tf.random.normal([rows, width])
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        serve(x=x)
        n += 1
    return n * rows / (time.perf_counter() - start)


def precision(src: str, tmp: Path, args, rounds: int = 5) -> dict:
    """float32 vs bfloat16 vs int8 on the XLA function (I/O buckets on, as by default).

    The machine is shared, so the variants are measured in turn, ``rounds`` times, and the median
    of each is kept."""
    import statistics

    import tensorflow as tf

    from kiln.inference import convert

    rng = np.random.default_rng(1)
    data = tmp / "calibration.npz"
    np.savez(data, x=rng.standard_normal((200, args.width)).astype(np.float32))
    xla = 'tpu_functions { function_alias: "body" } '
    variants = {
        "XLA float32": xla + "bfloat16_optimization: DISABLED",
        "XLA bfloat16": xla,
        "XLA int8": xla + "bfloat16_optimization: DISABLED external_feature_configs { quantization_options { "
                          "quantization_method { preset_method: METHOD_STATIC_RANGE_INT8 } op_set: XLA "
                          'representative_datasets { key: "serving_default" '
                          f'value {{ tfrecord_file_path: "{data}" }} }}'
                          " } }",
    }
    models, errors, serves = {}, {}, {}
    for name, options in variants.items():
        models[name] = str(tmp / name.replace(" ", "_"))
        with warnings.catch_warnings():  # the slower-on-this-CPU warning: the figures printed say it
            warnings.simplefilter("ignore")
            report = convert(src, models[name], options)
        stage = "quantization" if "int8" in name else "bfloat16"
        errors[name] = report.accuracy.get(stage, {}).get("serving_default", {}).get("outputs", {}).get("y", {})
        serves[name] = tf.saved_model.load(models[name]).signatures["serving_default"]
        for rows in (1, args.rows):
            serves[name](x=tf.zeros([rows, args.width]))  # compile the buckets
    single, batch = {n: [] for n in variants}, {n: [] for n in variants}
    for _ in range(rounds):
        for name in variants:
            single[name].append(throughput(models[name], args.width, args.clients, max(2, args.requests // 2)))
            batch[name].append(rows_per_second(serves[name], args.width, args.rows))
    out, base = {}, None
    for name in variants:
        s, b = statistics.median(single[name]), statistics.median(batch[name])
        base = base or (s, b)
        err = errors[name]
        out[name] = {"single_row_rps": round(s, 1), f"rows_per_s_at_{args.rows}": round(b, 1),
                     "max_rel_error": err.get("max_rel")}
        print(f"{name:<14} {s:9.1f} req/s single-row ({s / base[0]:.2f}x)  {b:10.1f} rows/s at "
              f"{args.rows} rows ({b / base[1]:.2f}x)" + (f"  max relative error {err['max_rel']:.3g}" if err else ""))
    return out


CONVERSION = ("tpu_functions {{ {selection} }} batch_options {{ max_batch_size: 16 "
              "allowed_batch_sizes: [4, 16] batch_timeout_micros: 2000 }}")


def conversion_times(src: str, selection: str, tmp: Path, rounds: int, evaluation_data=None, label: str = "") -> dict:
    """Per-stage seconds (median of ``rounds``) with the accuracy guard and with it skipped, alternating."""
    import statistics

    from kiln.inference import convert

    options = CONVERSION.format(selection=selection)
    runs = {"guard": [], "skipped": []}
    reports = {}
    for r in range(rounds):
        for variant in runs:
            text = options + (" skip_accuracy_check: true" if variant == "skipped" else "")
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reports[variant] = convert(src, str(tmp / f"{label}_{variant}_{r}"), text,
                                           evaluation_data=evaluation_data)
            runs[variant].append(dict(reports[variant].timings, total=time.perf_counter() - start))
    steps = list(runs["guard"][0])
    table = {v: {k: statistics.median(t[k] for t in runs[v]) for k in steps} for v in runs}
    print(f"\nconversion time by stage, {label} (median of {rounds} alternating rounds, seconds):")
    print(f"{'stage':<30}{'guard on':>10}{'skipped':>10}")
    for k in steps:
        print(f"{k:<30}{table['guard'][k]:>10.2f}{table['skipped'][k]:>10.2f}")
    ratio = table["guard"]["total"] / table["skipped"]["total"]
    print(f"skip_accuracy_check converts {ratio:.2f}x faster")
    report = reports["guard"]
    print(f"latency of each placed function on this machine ({report.machine}), median per call:")
    for name, t in report.latency.items():
        if "after_ms" in t:
            print(f"  {name} at {t['rows']} rows: before {t['before_ms']:.3f} ms, after {t['after_ms']:.3f} ms "
                  f"({t['after_ms'] / t['before_ms']:.2f}x the time; first call {t['first_call_after_ms']:.0f} ms)")
    return {"stages": table, "skip_speedup": round(ratio, 2), "latency": report.latency, "machine": report.machine}


def build_mobilenet(path: Path) -> tuple[str, dict]:
    """Keras Applications MobileNetV2 (random weights, 96x96) exported with Keras 3's model.export."""
    import keras

    model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), include_top=False, pooling="avg")
    model.export(str(path), verbose=False)
    x = np.random.default_rng(0).uniform(-1, 1, (16, 96, 96, 3)).astype(np.float32)
    return str(path), {"serving_default": [{"keras_tensor": x[i:i + 1]} for i in range(16)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rows", type=int, default=64, help="rows per request in the batch-throughput column")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the conversion timing")
    parser.add_argument("--mobilenet", action="store_true", help="also time converting MobileNetV2 (slow)")
    parser.add_argument("--conversion_only", action="store_true", help="skip the serving throughput sections")
    args = parser.parse_args()

    import tensorflow as tf

    from kiln.inference import convert

    results = {"device": tf.config.list_logical_devices()[-1].device_type, "clients": args.clients,
               "requests_per_client": args.requests, "width": args.width}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = build(tmp / "input", args.width)
        results["conversion"] = {"mlp": conversion_times(src, 'function_alias: "body"', tmp, args.rounds,
                                                          label="4x512 MLP")}
        if args.mobilenet:
            mobilenet, data = build_mobilenet(tmp / "mobilenet")
            results["conversion"]["mobilenet_v2"] = conversion_times(
                mobilenet, 'signature_name: "serving_default"', tmp, args.rounds, data, label="MobileNetV2 96x96")
        if args.conversion_only:
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
            return
        variants = {
            "input (TF ops)": src,
            "XLA": 'tpu_functions { function_alias: "body" }' + F32,
            "batched": BATCHING.format(target='experimental { function_alias: "body" }') + F32,
            "XLA + batched": 'tpu_functions { function_alias: "body" } ' + BATCHING.format(target="") + F32,
        }
        for name, options in variants.items():
            model = options if name.startswith("input") else None
            if model is None:
                model = str(tmp / name.replace(" ", "_").replace("+", "and"))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    convert(src, model, options)
            rps = throughput(model, args.width, args.clients, args.requests)
            results[name] = round(rps, 1)
            print(f"{name:<16} {rps:9.1f} requests/s  ({args.clients} clients x {args.requests} single-row requests)")
        buckets = compiles_per_bucket(str(tmp / "XLA_and_batched"), args.width, args.clients)
        results["xla_compiles_per_bucket"] = buckets
        print("XLA compiles per batch bucket (XLA + batched, 1-3 row clients):",
              ", ".join(f"{k} rows: {v}" for k, v in buckets.items()) or "none")
        results["precision"] = precision(src, tmp, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
