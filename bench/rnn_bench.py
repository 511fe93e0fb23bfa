"""RNN models side by side: kiln's converter vs TensorFlow's, both run in LiteRT.

For each model: the ops each converter emits, the file size, LiteRT's invoke latency (default
delegates; the two models take turns in blocks, the fastest block median counts) and the
ratios kiln / TensorFlow, plus each model's largest
deviation from Keras on the *second* invocation (TensorFlow's fused LSTMs keep the previous
call's state there). One run, a few seconds per model:

    .venv/bin/python bench/rnn_bench.py [--invokes 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

BATCH, TIME, FEATURES, UNITS = 1, 32, 16, 64


def _models():
    """name -> (builder of a Keras model, input maker). Built lazily: TF/Keras import is slow."""
    import keras
    import tf_keras

    def seq_input():
        return np.random.default_rng(0).standard_normal((BATCH, TIME, FEATURES)).astype(np.float32)

    def ids_input():
        return np.random.default_rng(0).integers(0, 1000, (BATCH, TIME)).astype(np.int32)

    def k3(layers, dtype="float32", shape=(TIME, FEATURES)):
        return lambda: keras.Sequential([keras.Input(shape, batch_size=BATCH, dtype=dtype), *layers()])

    return {
        "lstm": (k3(lambda: [keras.layers.LSTM(UNITS, return_sequences=True)]), seq_input),
        "stacked_lstm": (k3(lambda: [keras.layers.LSTM(UNITS, return_sequences=True),
                                     keras.layers.LSTM(UNITS)]), seq_input),
        "bidirectional_lstm": (k3(lambda: [keras.layers.Bidirectional(
            keras.layers.LSTM(UNITS, return_sequences=True))]), seq_input),
        "embedding_lstm": (k3(lambda: [keras.layers.Embedding(1000, 32), keras.layers.LSTM(UNITS),
                                       keras.layers.Dense(4)], dtype="int32", shape=(TIME,)),
                           ids_input),
        "gru (loop in both)": (k3(lambda: [keras.layers.GRU(UNITS, return_sequences=True)]),
                               seq_input),
        "tf_keras_lstm": (lambda: tf_keras.Sequential([
            tf_keras.Input((TIME, FEATURES), batch_size=BATCH),
            tf_keras.layers.LSTM(UNITS, return_sequences=True)]), seq_input),
    }


def _randomize(model):
    rng = np.random.default_rng(1)
    model.set_weights([rng.uniform(-0.3, 0.3, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def convert_kiln(model) -> bytes:
    import kiln

    return kiln.TFLiteConverter.from_keras_model(model).convert()


def convert_tf(model) -> bytes:
    import contextlib
    import io

    import tensorflow as tf

    with contextlib.redirect_stdout(io.StringIO()):  # Keras 3 export chatter
        return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def prepare(data: bytes, x: np.ndarray) -> dict:
    """Load into LiteRT: op counts, size, the outputs of a first and a second invocation."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=data)
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]
    outputs = []
    for _ in range(2):
        interp.set_tensor(inp, x)
        interp.invoke()
        outputs.append(interp.get_tensor(out))
    ops = Counter(d["op_name"] for d in interp._get_ops_details())  # noqa: SLF001
    return {"ops": dict(ops), "size": len(data), "outputs": outputs,
            "_run": (interp, inp, x)}


def latencies(sides: list[dict], invokes: int, blocks: int = 5) -> None:
    """Median invoke time per side, in ms. The sides take turns in ``blocks`` blocks and the
    fastest block median counts, so that load from other processes hits both alike."""
    best = [float("inf")] * len(sides)
    for _ in range(blocks):
        for k, side in enumerate(sides):
            interp, inp, x = side["_run"]
            times = []
            for _ in range(max(invokes // blocks, 1)):
                interp.set_tensor(inp, x)
                start = time.perf_counter()
                interp.invoke()
                times.append(time.perf_counter() - start)
            best[k] = min(best[k], statistics.median(times))
    for side, t in zip(sides, best):
        side["latency_ms"] = 1e3 * t
        del side["_run"]


def _ops_text(ops: dict) -> str:
    keep = ("UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM", "WHILE")
    parts = [f"{n} {ops[n]}x" for n in keep if ops.get(n)]
    return ", ".join(parts) + f" ({sum(ops.values())} ops)"


def run(invokes: int) -> list[dict]:
    rows = []
    for name, (build, make_input) in _models().items():
        model = _randomize(build())
        x = make_input()
        want = np.asarray(model(x))
        row = {"model": name}
        for side, convert in (("kiln", convert_kiln), ("tf", convert_tf)):
            try:
                res = prepare(convert(model), x)
            except Exception as exc:  # noqa: BLE001 - a converter failing is a result
                row[side] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
                continue
            res["error_vs_keras"] = [float(np.max(np.abs(o - want))) for o in res.pop("outputs")]
            row[side] = res
        latencies([r for r in (row["kiln"], row["tf"]) if "_run" in r], invokes)
        if "latency_ms" in row["kiln"] and "latency_ms" in row.get("tf", {}):
            row["size_ratio"] = row["kiln"]["size"] / row["tf"]["size"]
            row["latency_ratio"] = row["kiln"]["latency_ms"] / row["tf"]["latency_ms"]
        rows.append(row)
        _print_row(row)
    return rows


def _print_row(row: dict) -> None:
    print(f"\n== {row['model']}")
    for side in ("kiln", "tf"):
        r = row[side]
        if "error" in r:
            print(f"  {side:4}: conversion failed: {r['error']}")
            continue
        err1, err2 = r["error_vs_keras"]
        print(f"  {side:4}: {_ops_text(r['ops'])}; {r['size']:,} bytes; {r['latency_ms']:.3f} ms; "
              f"max |error| vs Keras: invoke 1 {err1:.1e}, invoke 2 {err2:.1e}")
    if "latency_ratio" in row:
        print(f"  kiln / tf: size {row['size_ratio']:.2f}x, latency {row['latency_ratio']:.2f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invokes", type=int, default=200, help="timed invocations per model")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    print(f"LiteRT, batch {BATCH}, {TIME} steps, {FEATURES} features, {UNITS} units; "
          f"{args.invokes} timed invokes per model in 5 alternating blocks")
    rows = run(args.invokes)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
