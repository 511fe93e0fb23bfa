"""kiln + XlaDelegate against LiteRT (XNNPACK), side by side in one run.

Models (TensorFlow's converter, batch fixed in the file as deployed models have it):
MobileNetV2 alpha=0.35 on 32x32, the runtime zoo's CNN and transformer block, and an
LSTM-128x2 (two stacked tf_keras LSTM(128) layers over 32 steps of 32 features), each at
batch 1 and batch 8, at equal threads: single-threaded (LiteRT num_threads=1 against the
delegate's default, single-threaded XLA) and two-threaded (LiteRT num_threads=2 against XLA's
intra-op pool, which spans every core). Engines take turns in short rounds, so a busy machine
slows them alike; the figures are the median and the fastest of the rounds' per-invoke times
(set_tensor excluded, like bench/runtime_bench.py). Also printed: the first invoke's XLA trace
+ compile time, and the largest output difference from LiteRT.

With a GPU jaxlib, the same models also run on the GPU at batch 1/8/64/256 (throughput in
samples/s against LiteRT on the CPU), in float32 and with dtype_policy="bfloat16" (its error
against float32 printed); without one the GPU part prints "no GPU".

    python bench/xla_bench.py [--seconds 2] [--batches 1 8] [--threads 1 2] [model ...]

Issue #33's table (free-batch MobileNetV2 1.0 224, 2-block transformer, LSTM 2x128), with no
TensorFlow where it runs: ``--build DIR [--small]`` converts the models where TensorFlow is;
``--models DIR [--device gpu] [--batches ...] [--out rows.json]`` then prints LiteRT (if
ai-edge-litert imports), Interpreter + XlaDelegate, to_jax + jit and the bfloat16 policy in
samples/s, with first-call and second-process seconds. bench/device_check.sh runs it on a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.runtime import zoo  # noqa: E402


# -- models (the runtime zoo's architectures, with the batch as a parameter) ----------------------

def cnn(batch: int) -> bytes:
    import keras

    zoo._seed()
    return zoo._from_keras(keras.Sequential([
        keras.Input((28, 28, 1), batch_size=batch),
        keras.layers.Conv2D(8, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ]))


def mobilenet(batch: int) -> bytes:
    import keras

    zoo._seed()
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35, classes=10)
    for layer in model.layers:  # real batch statistics (see tests/runtime/zoo.py)
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(np.random.default_rng(7).standard_normal((8, 32, 32, 3)).astype(np.float32), training=True)
    inp = keras.Input((32, 32, 3), batch_size=batch)
    return zoo._from_keras(keras.Model(inp, model(inp)))


def transformer(batch: int) -> bytes:
    import keras

    zoo._seed()
    inp = keras.Input((16, 32), batch_size=batch)
    att = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(inp, inp)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(inp + att)
    ff = keras.layers.Dense(64, activation="gelu")(x)
    ff = keras.layers.Dense(32)(ff)
    out = keras.layers.LayerNormalization(epsilon=1e-6)(x + ff)
    return zoo._from_keras(keras.Model(inp, out))


def lstm_128x2(batch: int) -> bytes:
    import tf_keras

    zoo._seed()
    return zoo._from_keras(tf_keras.Sequential([
        tf_keras.Input((32, 32), batch_size=batch),
        tf_keras.layers.LSTM(128, return_sequences=True),
        tf_keras.layers.LSTM(128),
    ]))


# -- issue #33's table: free-batch models, built where TensorFlow is (--build), run anywhere (--models) --

def table_mobilenet(small: bool) -> bytes:
    """MobileNetV2 1.0 at 224x224 (small: alpha 0.35 at 64x64), batch free."""
    import keras

    zoo._seed()
    size, alpha = (64, 0.35) if small else (224, 1.0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3), alpha=alpha)
    for layer in model.layers:  # real batch statistics (see tests/runtime/zoo.py)
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(np.random.default_rng(7).standard_normal((4, size, size, 3)).astype(np.float32), training=True)
    inp = keras.Input((size, size, 3))
    return zoo._from_keras(keras.Model(inp, model(inp)))


def table_transformer(small: bool) -> bytes:
    """Two transformer blocks, sequence 128, width 256, 8 heads (small: 32, 64, 4), batch free."""
    import keras

    zoo._seed()
    seq, width, heads = (32, 64, 4) if small else (128, 256, 8)
    inp = x = keras.Input((seq, width))
    for _ in range(2):
        att = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + att)
        ff = keras.layers.Dense(4 * width, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dense(width)(ff))
    return zoo._from_keras(keras.Model(inp, x))


def table_lstm(small: bool) -> bytes:
    """Two stacked tf_keras LSTM(128) over 64 steps of 32 features (small: LSTM(32), 16 steps), batch
    free: kiln's converter (TensorFlow's refuses a free-batch LSTM without its tensor-list ops)."""
    import tf_keras

    zoo._seed()
    units, steps = (32, 16) if small else (128, 64)
    return kiln.TFLiteConverter.from_keras_model(tf_keras.Sequential([
        tf_keras.Input((steps, 32)),
        tf_keras.layers.LSTM(units, return_sequences=True),
        tf_keras.layers.LSTM(units),
    ])).convert()


#: name -> (builder, the batches issue #33's table runs it at)
TABLE = {"mobilenet_v2": (table_mobilenet, (64,)), "transformer": (table_transformer, (64, 256)),
         "lstm_2x128": (table_lstm, (1, 64))}


class _Engine:
    """One way to run a model on a batch, timed by `interleaved` through ``invoke()``: the
    whole call a user makes (inputs in, outputs back in NumPy)."""

    def __init__(self, call):
        self.invoke = call


def _interpreter_engine(interp, x):
    """The whole call on ``interp``; the first also resizes and allocates (where kiln's
    interpreter may already run, and so compile, the partitions to learn output shapes)."""
    (d,), outs = interp.get_input_details(), interp.get_output_details()
    ready = []

    def call():
        if not ready:
            if tuple(d["shape"]) != x.shape:
                interp.resize_tensor_input(d["index"], list(x.shape))
            interp.allocate_tensors()
            ready.append(True)
        interp.set_tensor(d["index"], x)
        interp.invoke()
        return [interp.get_tensor(o["index"]) for o in outs]

    return call


def _first(call) -> tuple[float, list]:
    start = time.perf_counter()
    out = call()
    return time.perf_counter() - start, out


def first_output_seconds(path: str, batch: int, device: str) -> float:
    """In a fresh process: seconds from making the delegate to the first output (the persistent
    compilation cache warm from this process's runs), as a server restarting sees it."""
    import subprocess

    code = ("import sys, time, numpy as np; sys.path.insert(0, %r); import kiln; from kiln.xla import XlaDelegate; "
            "t = time.perf_counter(); it = kiln.Interpreter(model_path=%r, experimental_delegates=[XlaDelegate(%r)]); "
            "d = it.get_input_details()[0]; it.resize_tensor_input(d['index'], [%d] + list(d['shape'][1:])); "
            "it.allocate_tensors(); it.set_tensor(d['index'], np.ones([%d] + list(d['shape'][1:]), np.float32)); "
            "it.invoke(); it.get_tensor(it.get_output_details()[0]['index']); print(time.perf_counter() - t)"
            % (str(Path(__file__).resolve().parents[1]), path, device, batch, batch))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return float(proc.stdout.split()[-1]) if proc.returncode == 0 else float("nan")


def table_rows(folder: Path, device: str, seconds: float, batches=None, threads: int | None = None):
    """Issue #33's table over the .tflite files `build_table` wrote: samples/s of LiteRT (when
    ai-edge-litert imports), Interpreter + XlaDelegate, kiln.xla.to_jax + jax.jit, and the
    delegate under dtype_policy="bfloat16" (its error against float32), with the first call's
    seconds (trace + compile) of each and a second process's seconds to its first output."""
    import json

    import jax

    from kiln.xla import to_jax

    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        LiteRT = None
    threads = threads or os.cpu_count()
    manifest = json.loads((folder / "manifest.json").read_text())
    where = jax.devices(device)[0]
    for name, entry in manifest.items():
        path = str(folder / f"{name}.tflite")
        data = Path(path).read_bytes()
        fn, params = to_jax(data)
        on_device = jax.device_put(params, where)
        jitted = jax.jit(fn)
        for batch in batches or entry["batches"]:
            shape = [batch] + entry["input_shape"][1:]
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            row = {"model": name, "batch": batch, "device": where.device_kind}
            engines, firsts = {}, {}
            for key, policy in (("xla", None), ("bf16", "bfloat16")):
                interp = kiln.Interpreter(model_content=data,
                                          experimental_delegates=[XlaDelegate(device, dtype_policy=policy)])
                call = _interpreter_engine(interp, x)
                firsts[key] = _first(call)
                engines[key] = _Engine(call)

            def jit_call():
                return [np.asarray(o) for o in jitted(on_device, jax.device_put(x, where))]

            firsts["to_jax"] = _first(jit_call)
            engines["to_jax"] = _Engine(jit_call)
            if LiteRT is not None:
                litert = LiteRT(model_content=data, num_threads=threads)
                engines["litert"] = _Engine(_interpreter_engine(litert, x))
            ms = interleaved(engines, seconds)
            row.update({f"{k}_per_s": batch / (v / 1e3) for k, v in ms.items()})
            f32, bf16 = firsts["xla"][1][0], firsts["bf16"][1][0]
            row["bf16_err"] = float(np.max(np.abs(bf16 - f32))) / max(1e-6, float(np.max(np.abs(f32))))
            row["xla_vs_to_jax_err"] = float(np.max(np.abs(firsts["to_jax"][1][0] - f32)))
            row.update({f"{k}_first_s": v[0] for k, v in firsts.items()})
            row["second_process_s"] = first_output_seconds(path, batch, device)
            yield row


def print_table(rows, out: Path | None = None) -> None:
    import json

    header = (f"{'model':<14} {'batch':>5} {'LiteRT/s':>9} {'kiln+XLA/s':>11} {'to_jax+jit/s':>13} {'ratio':>6} "
              f"{'XLA bf16/s':>11} {'bf16 err':>9} {'1st XLA s':>9} {'1st jit s':>9} {'1st bf16 s':>10} {'2nd proc s':>10}")
    print(header)
    print("-" * len(header))
    done = []
    for r in rows:
        done.append(r)
        litert = f"{r['litert_per_s']:>9.0f}" if "litert_per_s" in r else f"{'-':>9}"
        print(f"{r['model']:<14} {r['batch']:>5} {litert} {r['xla_per_s']:>11.0f} {r['to_jax_per_s']:>13.0f} "
              f"{r['xla_per_s'] / r['to_jax_per_s']:>6.2f} {r['bf16_per_s']:>11.0f} {r['bf16_err']:>9.1e} "
              f"{r['xla_first_s']:>9.2f} {r['to_jax_first_s']:>9.2f} {r['bf16_first_s']:>10.2f} "
              f"{r['second_process_s']:>10.2f}", flush=True)
        if out is not None:
            out.write_text(json.dumps(done, indent=1))


def build_table(folder: Path, small: bool) -> None:
    """Write the table's models (TensorFlow needed) and a manifest into ``folder``."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, (builder, batches) in TABLE.items():
        data = builder(small)
        (folder / f"{name}.tflite").write_bytes(data)
        shape = [int(s) for s in kiln.Interpreter(model_content=data).get_input_details()[0]["shape"]]
        manifest[name] = {"batches": list(batches), "input_shape": shape, "small": small}
        print(f"wrote {folder / name}.tflite ({len(data) / 1e6:.1f} MB)", flush=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))


MODELS = {"mobilenet_v2_0.35": mobilenet, "cnn": cnn, "transformer": transformer, "lstm_128x2": lstm_128x2}


def model_bytes(name: str, batch: int) -> bytes:
    """Converted once and cached next to the runtime zoo (keyed by the builder's source)."""
    build = MODELS[name]
    key = hashlib.sha256(inspect.getsource(build).encode()).hexdigest()[:8]

    def builder():
        return build(batch)

    return zoo.cached_model(f"xla_bench-{name}-b{batch}-{key}", builder).read_bytes()


# -- timing --------------------------------------------------------------------------------------

def _ready(interp, inputs):
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    start = time.perf_counter()
    interp.invoke()
    return time.perf_counter() - start


def _per_invoke(interp, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        interp.invoke()
    return (time.perf_counter() - start) / count


def interleaved(engines: dict, seconds: float, best: bool = False) -> dict[str, float]:
    """Median ms per invoke of each engine, measured in alternating ~10 ms rounds; with
    ``best`` also the fastest round's (the figure least disturbed by other processes on a
    shared machine), as {key + "_best": ms}."""
    count = {k: max(1, int(0.01 / max(_per_invoke(v, 3), 1e-7))) for k, v in engines.items()}
    samples: dict[str, list[float]] = {k: [] for k in engines}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or min(len(s) for s in samples.values()) < 5:
        for key, interp in engines.items():
            samples[key].append(_per_invoke(interp, count[key]))
    result = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
    if best:
        result.update({f"{k}_best": float(np.min(v)) * 1e3 for k, v in samples.items()})
    return result


def cpu_row(name: str, batch: int, seconds: float, threads: int = 1) -> str:
    """One model at one batch: LiteRT with ``threads`` threads against kiln+XLA, single-threaded
    (the delegate's CPU default) for 1, on XLA's intra-op pool (every core) otherwise."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    data = model_bytes(name, batch)
    delegate = XlaDelegate(device="cpu", compiler_options=None if threads == 1 else
                           {"xla_cpu_multi_thread_eigen": True})
    engines = {"litert": LiteRT(model_content=data, num_threads=threads),
               "xla": kiln.Interpreter(model_content=data, experimental_delegates=[delegate])}
    inputs = zoo.sample_inputs(engines["litert"].get_input_details(), 0)
    first = {k: _ready(v, inputs) for k, v in engines.items()}
    outs = {k: [v.get_tensor(d["index"]) for d in v.get_output_details()] for k, v in engines.items()}
    err = max(float(np.max(np.abs(a - b))) / max(1e-6, float(np.max(np.abs(b))))
              for a, b in zip(outs["xla"], outs["litert"]))
    ms = interleaved(engines, seconds, best=True)
    left = len(delegate.rejected)
    return (f"{name:<18} {batch:>5} {threads:>7} {ms['litert']:>12.3f} {ms['xla']:>10.3f} {ms['xla'] / ms['litert']:>8.2f}x "
            f"{ms['litert_best']:>10.3f} {ms['xla_best']:>10.3f} {ms['xla_best'] / ms['litert_best']:>8.2f}x "
            f"{first['xla'] * 1e3:>14.0f} {delegate.compile_seconds * 1e3:>11.0f} {err:>9.1e} "
            f"{len(delegate.kernels):>5}{'' if not left else f' ({left} nodes on reference kernels)'}")


def gpu_section(names, seconds: float) -> None:
    import jax

    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        print("\nGPU: no GPU (JAX sees only " + ", ".join(d.platform for d in jax.devices()) + ")")
        return
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    print(f"\nGPU ({gpus[0].device_kind}): samples/s, kiln+XLA on the GPU vs LiteRT (XNNPACK) on the CPU; "
          "bf16 = dtype_policy='bfloat16', error relative to the float32 output's scale")
    header = f"{'model':<18} {'batch':>5} {'LiteRT-CPU':>11} {'XLA-GPU f32':>12} {'speedup':>8} {'XLA-GPU bf16':>13} {'bf16 err':>9}"
    print(header)
    print("-" * len(header))
    for name in names:
        for batch in (1, 8, 64, 256):
            data = model_bytes(name, batch)
            engines = {"litert": LiteRT(model_content=data),
                       "f32": kiln.Interpreter(model_content=data, experimental_delegates=[XlaDelegate("gpu")]),
                       "bf16": kiln.Interpreter(model_content=data,
                                                experimental_delegates=[XlaDelegate("gpu", "bfloat16")])}
            inputs = zoo.sample_inputs(engines["litert"].get_input_details(), 0)
            for interp in engines.values():
                _ready(interp, inputs)
            f32 = engines["f32"].get_tensor(engines["f32"].get_output_details()[0]["index"])
            bf16 = engines["bf16"].get_tensor(engines["bf16"].get_output_details()[0]["index"])
            err = float(np.max(np.abs(bf16 - f32))) / max(1e-6, float(np.max(np.abs(f32))))
            ms = interleaved(engines, seconds)
            rate = {k: batch / (v / 1e3) for k, v in ms.items()}
            print(f"{name:<18} {batch:>5} {rate['litert']:>11.0f} {rate['f32']:>12.0f} "
                  f"{rate['f32'] / rate['litert']:>7.1f}x {rate['bf16']:>13.0f} {err:>9.1e}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS), help=f"default: all of {list(MODELS)}")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per row (default 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="default: 1 8; with --models, the table's own per model")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="LiteRT's num_threads; 1 pairs it with single-threaded XLA (the delegate's "
                             "default), more with XLA's intra-op pool over every core (default: 1 2)")
    parser.add_argument("--build", type=Path, metavar="DIR",
                        help="write issue #33's table models (.tflite, TensorFlow needed) into DIR and stop")
    parser.add_argument("--small", action="store_true", help="with --build: small sizes, for a CPU")
    parser.add_argument("--models", dest="table_dir", type=Path, metavar="DIR",
                        help="run issue #33's table over the files --build wrote (no TensorFlow needed)")
    parser.add_argument("--device", default=None, help="with --models: cpu or gpu (default: JAX's default)")
    parser.add_argument("--out", type=Path, help="with --models: also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.build is not None:
        build_table(args.build, args.small)
        return
    import jax

    if args.table_dir is not None:
        device = args.device or jax.devices()[0].platform
        print(f"issue #33's table on {jax.devices(device)[0].device_kind} ({device}), jax {jax.__version__}: samples/s "
              f"(ratio = kiln+XLA / to_jax+jit), first-call and second-process seconds")
        print_table(table_rows(args.table_dir, device, args.seconds, args.batches), args.out)
        return

    args.batches = args.batches or [1, 8]
    t0 = time.perf_counter()
    for name in args.models:  # convert first (TensorFlow), so conversion never overlaps timing
        for batch in args.batches:
            model_bytes(name, batch)
    print(f"CPU: ms per invoke, median and best round; ratio = kiln+XLA / LiteRT (XNNPACK); {os.cpu_count()} CPUs, "
          f"jax {jax.__version__}; threads = LiteRT's num_threads, kiln+XLA single-threaded at 1, "
          f"on every core ({os.cpu_count()}) otherwise")
    header = (f"{'model':<18} {'batch':>5} {'threads':>7} {'LiteRT+XNN':>12} {'kiln+XLA':>10} {'ratio':>9} "
              f"{'best LiteRT':>10} {'best XLA':>10} {'ratio':>9} "
              f"{'1st invoke ms':>14} {'compile ms':>11} {'rel err':>9} {'parts':>5}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        for batch in args.batches:
            for threads in args.threads:
                print(cpu_row(name, batch, args.seconds, threads), flush=True)
    gpu_section(args.models, args.seconds)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
