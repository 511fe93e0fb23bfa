"""kiln's interpreter against LiteRT, measured side by side in one process.

Default section (bench/runtime_models.py): five Keras models none of kiln's tests use —
MobileNetV2, a residual CNN, a transformer block, an LSTM and a CNN with a Python custom op —
converted by kiln's converter (``--converter tf``: TensorFlow's). Each runs in LiteRT's default
interpreter (XNNPACK) and in kiln's default Interpreter (LiteRT's kernels for the builtin
partitions, Python for the custom op; the custom-op model's LiteRT figure is its builtin
twin's) and, with ``--own``, on kiln's own kernels (``kiln-own``: its compiled delegates, as
without ai-edge-litert). A call is set_tensor + invoke + get_tensor; engines take turns in
~5 ms rounds, in ABBA order. It prints the median per call, the ratio kiln / LiteRT (the
median of the rounds' ratios: a round's calls run back to back, so load that changes
between rounds cancels out), the geometric mean of the ratios, the largest difference from
LiteRT's outputs and the backends that ran the nodes. The targets (issue #23): ratio
<= 1.25 (custom-op model <= 1.35), geomean <= 1.10, outputs within 1e-5 of LiteRT's.

``--zoo``: the runtime test zoo (TensorFlow-converted) in LiteRT with XNNPACK, LiteRT's plain
builtin kernels, kiln's default Interpreter and kiln's reference kernels alone
(``OpResolverType.BUILTIN_REF``), the figure the median over rounds of the per-invoke time;
the last columns count the nodes one reference invoke executes (control-flow bodies
included) and the reference path's time per node, the interpreter's per-node cost.
Prints tables, asserts nothing.

    python bench/runtime_bench.py [--seconds 4] [--converter kiln|tf] [--own] [model ...]
    python bench/runtime_bench.py --zoo [--seconds 1.5] [model ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from bench import runtime_models  # noqa: E402
from tests.runtime.zoo import ZOO, sample_inputs, zoo_bytes  # noqa: E402

#: Issue #23's targets: kiln / LiteRT per model (the custom-op model's against its twin), geomean.
TARGET, CUSTOM_TARGET, GEOMEAN_TARGET, TOLERANCE = 1.25, 1.35, 1.10, 1e-5


def engines(data: bytes) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    return {
        "litert": LiteRT(model_content=data),
        "litert-builtin": LiteRT(model_content=data,
                                 experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
        "kiln": kiln.Interpreter(model_content=data),
        "kiln-ref": kiln.Interpreter(model_content=data, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF),
    }


def prepare(interp, inputs) -> None:
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()


def per_invoke(interp, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        interp.invoke()
    return (time.perf_counter() - start) / count


def profiled_invoke(interp) -> list:
    """The profiler events of one invoke of a kiln interpreter (every subgraph, every loop trip)."""
    events = []
    interp.profiler = events.append
    try:
        interp.invoke()
    finally:
        interp.profiler = None
    return events


def executed_steps(interp) -> int:
    """Plan steps one invoke of a kiln interpreter runs."""
    return len(profiled_invoke(interp))


def measure(name: str, seconds: float) -> dict[str, float]:
    data = zoo_bytes(name)
    runs = engines(data)
    ref = runs["litert-builtin"]
    inputs = sample_inputs(ref.get_input_details(), 0)
    for interp in runs.values():
        prepare(interp, inputs)
    steps = executed_steps(runs["kiln-ref"])
    # Size each engine's batch to ~10 ms so rounds are short and interleaved.
    batch = {k: max(1, int(0.01 / max(per_invoke(v, 3), 1e-7))) for k, v in runs.items()}
    samples: dict[str, list[float]] = {k: [] for k in runs}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or min(len(s) for s in samples.values()) < 5:
        for key, interp in runs.items():
            samples[key].append(per_invoke(interp, batch[key]))
    return {"steps": steps, **{k: float(np.median(v)) * 1e3 for k, v in samples.items()}}


# -- the default section: unseen Keras models, kiln's default Interpreter against LiteRT ------------

def call(interp, inputs, in_indices, out_indices) -> list[np.ndarray]:
    for i, x in zip(in_indices, inputs):
        interp.set_tensor(i, x)
    interp.invoke()
    return [interp.get_tensor(i) for i in out_indices]


def per_call(interp, inputs, in_indices, out_indices, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        call(interp, inputs, in_indices, out_indices)
    return (time.perf_counter() - start) / count


def model_engines(name: str, converter: str, rebuild: bool, own: bool) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    twin = runtime_models.model_bytes(name, converter, rebuild)
    ours, registerers = twin, []
    if name == "custom_cnn":
        ours, registerers = runtime_models.with_custom_op(twin), [runtime_models.register_custom_op]
    runs = {"litert": LiteRT(model_content=twin),
            "kiln": kiln.Interpreter(model_content=ours, custom_op_registerers=registerers)}
    if own:
        runs["kiln-own"] = kiln.Interpreter(
            model_content=ours, custom_op_registerers=registerers,
            experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF,
            experimental_delegates=[kiln.delegates.NumpyDelegate()])
    return runs


def backends(interp) -> str:
    """Which backend ran the nodes of one invoke of subgraph 0: "litert 64, kiln 1"."""
    events = profiled_invoke(interp)
    counts: dict[str, int] = {}
    for e in events:
        if e.subgraph == 0:
            key = e.delegate or "kiln"
            counts[key] = counts.get(key, 0) + len(e.op_names)
    return ", ".join(f"{k} {n}" for k, n in counts.items())


def measure_model(name: str, seconds: float, converter: str, rebuild: bool, own: bool) -> dict:
    runs = model_engines(name, converter, rebuild, own)
    io = {}
    for key, interp in runs.items():
        interp.allocate_tensors()
        io[key] = ([d["index"] for d in interp.get_input_details()],
                   [d["index"] for d in interp.get_output_details()])
    inputs = sample_inputs(runs["litert"].get_input_details(), 0)
    outputs = {key: call(interp, inputs, *io[key]) for key, interp in runs.items()}
    expected = outputs["litert"]
    scale = max(1.0, max(float(np.abs(e).max()) for e in expected))
    diff = max(float(np.abs(a.astype(np.float64) - e).max()) for a, e in zip(outputs["kiln"], expected))
    for interp, key in zip(runs.values(), runs):  # warm up (XNNPACK's first-invoke setup, caches)
        per_call(interp, inputs, *io[key], 5)
    batch = {k: max(1, int(0.005 / max(per_call(v, inputs, *io[k], 3), 1e-7))) for k, v in runs.items()}
    samples: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or min(len(s) for s in samples.values()) < 15:
        for key in order:
            samples[key].append(per_call(runs[key], inputs, *io[key], batch[key]))
        order.reverse()  # ABBA: neither engine always runs right after the other
    ms = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
    # The ratio is the median of each round's kiln / LiteRT: the two calls of a round run
    # back to back, so load that changes between rounds cancels out.
    paired = {k: float(np.median(np.array(v) / np.array(samples["litert"]))) for k, v in samples.items()}
    return {**ms, "ratio": paired, "diff": diff, "scale": scale, "backends": backends(runs["kiln"])}


def models_main(args) -> None:
    names = args.models or list(runtime_models.MODELS)
    unknown = [n for n in names if n not in runtime_models.MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; have {list(runtime_models.MODELS)}")
    t0 = time.perf_counter()
    for name in names:  # convert first (TensorFlow), so conversion never overlaps timing
        runtime_models.model_bytes(name, args.converter, args.rebuild)
    print(f"median ms per call (set_tensor + invoke + get_tensor), batch 1, {args.converter}-converted; "
          f"ratio = kiln / LiteRT (default interpreter, XNNPACK); {os.cpu_count()} CPUs")
    own = (f" {'kiln-own':>9} {'own ratio':>9}" if args.own else "")
    header = f"{'model':<13} {'LiteRT':>8} {'kiln':>8} {'ratio':>6} {'target':>6}{own} {'max |diff|':>10}  backends (nodes)"
    print(header)
    print("-" * len(header))
    ratios = []
    for name in names:
        m = measure_model(name, args.seconds, args.converter, args.rebuild, args.own)
        ratio = m["ratio"]["kiln"]
        ratios.append(ratio)
        target = CUSTOM_TARGET if name == "custom_cnn" else TARGET
        flag = "" if ratio <= target and m["diff"] <= TOLERANCE * m["scale"] else " !"
        own = f" {m['kiln-own']:>9.3f} {m['ratio']['kiln-own']:>8.2f}x" if args.own else ""
        print(f"{name:<13} {m['litert']:>8.3f} {m['kiln']:>8.3f} {ratio:>5.2f}x {target:>5.2f}x{own} "
              f"{m['diff']:>10.1e}  {m['backends']}{flag}")
    geomean = float(np.exp(np.mean(np.log(ratios))))
    print(f"geomean kiln / LiteRT: {geomean:.3f}x (target <= {GEOMEAN_TARGET:.2f}x); "
          f"custom_cnn's LiteRT column is its builtin twin ({time.perf_counter() - t0:.0f} s)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"models (default: all of {list(runtime_models.MODELS)}; "
                                                  f"with --zoo: {list(ZOO)})")
    parser.add_argument("--zoo", action="store_true", help="the runtime test zoo against LiteRT's builtin kernels")
    parser.add_argument("--seconds", type=float, default=4.0, help="measuring time per model (default 4)")
    parser.add_argument("--converter", choices=("kiln", "tf"), default="kiln",
                        help="which converter makes the bench models (default kiln)")
    parser.add_argument("--rebuild", action="store_true", help="convert the bench models again")
    parser.add_argument("--own", action="store_true",
                        help="also time kiln's own kernels (its compiled delegates, as without ai-edge-litert)")
    args = parser.parse_args(argv)
    if not args.zoo:
        models_main(args)
        return
    args.models = args.models or list(ZOO)
    t0 = time.perf_counter()
    for name in args.models:  # convert first (TensorFlow), so conversion never overlaps timing
        zoo_bytes(name)
    print(f"median ms per invoke; ratio = kiln / LiteRT (builtin kernels, XNNPACK off); "
          f"{os.cpu_count()} CPUs, numpy {np.__version__}")
    header = (f"{'model':<14} {'LiteRT+XNN':>10} {'LiteRT':>9} {'kiln':>9} {'ratio':>7} "
              f"{'kiln ref':>9} {'ratio':>7} {'delegate speedup':>16} {'nodes':>6} {'us/node':>8}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        ms = measure(name, args.seconds)
        lite, ours, ref = ms["litert-builtin"], ms["kiln"], ms["kiln-ref"]
        print(f"{name:<14} {ms['litert']:>10.3f} {lite:>9.3f} {ours:>9.3f} {ours / lite:>6.0f}x "
              f"{ref:>9.3f} {ref / lite:>6.0f}x {ref / ours:>15.2f}x "
              f"{ms['steps']:>6} {ref * 1e3 / max(1, ms['steps']):>8.1f}")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
