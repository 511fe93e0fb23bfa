"""Where a kiln+XLA invoke spends its time on the CPU: per XLA step (thunk), from a JAX trace.

For each model of bench/xla_bench.py at one batch, the partition's executable runs under
jax.profiler with XLA's per-thunk trace events on; the script prints the whole call, the thunk
executor's span, the sum of the thunks (the difference is the executor's own per-step cost),
the time per kind of thunk (dot, each fusion kind, concatenate, ...; a loop's body thunks count
inside the loop too) and the slowest thunks, each the median over the traced invokes. With --hlo DIR it also writes the optimized HLO, so
a thunk's name can be looked up. Compiler options are the delegate's defaults unless given
as --option name=value (JSON values: true, 1, "text").

    python bench/xla_profile.py [--batch 8] [--invokes 200] [--option xla_cpu_multi_thread_eigen=true] [model ...]
    python bench/xla_profile.py --tflite model.tflite [--batch 8]   # any model file (its own batch unless given)
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from bench.xla_bench import MODELS, model_bytes  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.runtime import zoo  # noqa: E402

#: Trace event names of XLA's thunks: an HLO instruction name (``dot_general.70``,
#: ``clamp_pad_fusion.11``, ``concatenate``), not a Python frame or a runtime span.
_THUNK = re.compile(r"^[a-z][a-z0-9_\-]*(\.\d+)?$")


def _events(trace_dir: str) -> tuple[dict[str, list[float]], set[str]]:
    """Durations (us) of every complete event in the perfetto trace, by name, and the names of
    thunks that ran inside another thunk (a while loop's or a conditional's body)."""
    (path,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
    with gzip.open(path) as f:
        data = json.load(f)
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data) if e.get("ph") == "X"]
    out: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        out[e["name"]].append(float(e.get("dur", 0)))
    nested: set[str] = set()
    open_until: dict = {}  # thread -> end times of the thunks still open there
    for e in sorted((e for e in events if _THUNK.match(e["name"])), key=lambda e: (e.get("tid"), e["ts"])):
        stack = open_until.setdefault(e.get("tid"), [])
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        if stack:
            nested.add(e["name"])
        stack.append(e["ts"] + e.get("dur", 0))
    return out, nested


def profile(name: str, batch: int, invokes: int, options: dict, hlo_dir: str | None, data: bytes | None = None) -> None:
    """Profile bench/xla_bench.py's model ``name`` at ``batch``, or the .tflite ``data`` as it is."""
    import jax

    if data is None:
        data = model_bytes(name, batch)
    delegate = XlaDelegate(device="cpu", compiler_options={**options, "xla_cpu_enable_xprof_traceme": True})
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    if data is not None and batch:  # a .tflite file at another batch
        for d in interp.get_input_details():
            interp.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
    interp.allocate_tensors()
    batch = batch or int(interp.get_input_details()[0]["shape"][0])
    for d, x in zip(interp.get_input_details(), zoo.sample_inputs(interp.get_input_details(), 0)):
        interp.set_tensor(d["index"], x)
    for _ in range(20):  # compile and warm up
        interp.invoke()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(invokes):
            interp.invoke()
        jax.profiler.stop_trace()
        events, nested = _events(trace_dir)
    # Medians per invoke: a thunk in a loop body runs once per iteration, so its events are summed
    # per invoke before taking the median (the executor span is the outermost one's).
    med = {k: float(np.median(np.sum(np.reshape(v, (invokes, -1)), axis=1))) if len(v) % invokes == 0
           else float(np.median(v)) for k, v in events.items()}
    thunks = {k: v for k, v in med.items() if _THUNK.match(k)}
    executor = max(events.get("ThunkExecutor::Execute", [0.0])) and \
        float(np.median(sorted(events["ThunkExecutor::Execute"])[-invokes:]))
    steps = sum(v for k, v in thunks.items() if k not in nested)
    print(f"\n{name} batch {batch}: {len(thunks) - len(nested)} thunks ({len(nested)} more in loop bodies) in "
          f"{len(delegate.kernels)} partition(s); median us per invoke")
    # With loops the executor's span can end before their bodies do (they run asynchronously),
    # so its own cost is only computed for loop-free executables.
    own = f"{executor - steps:7.1f}" if not nested else "    n/a (loops)"
    print(f"  thunk executor {executor:9.1f}   its thunks {steps:9.1f}   executor's own {own}")
    kinds: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    for k, v in thunks.items():
        kind = re.sub(r"\.\d+$", "", k)
        kinds[kind] += v
        counts[kind] += 1
    print("  by kind: " + ", ".join(f"{k} x{counts[k]} {v:.1f}" for k, v in
                                    sorted(kinds.items(), key=lambda kv: -kv[1])[:10]))
    print("  slowest: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(thunks.items(), key=lambda kv: -kv[1])[:8]))
    if hlo_dir:
        os.makedirs(hlo_dir, exist_ok=True)
        for i, kernel in enumerate(delegate.kernels):
            for j, run in enumerate(kernel.cache.values()):
                Path(hlo_dir, f"{name}-b{batch}-part{i}-{j}.hlo").write_text(run.as_text())


def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"default: all of {list(MODELS)} (none with --tflite)")
    parser.add_argument("--batch", type=int, help="default 8 for the bench models, a .tflite file's own")
    parser.add_argument("--invokes", type=int, default=200)
    parser.add_argument("--option", action="append", default=[], type=_option, help="XLA compile option name=value")
    parser.add_argument("--hlo", help="write each executable's optimized HLO to this directory")
    parser.add_argument("--tflite", action="append", default=[], help="also profile this .tflite file (its own batch)")
    args = parser.parse_args(argv)
    for path in args.tflite:
        profile(Path(path).stem, args.batch or 0, args.invokes, dict(args.option), args.hlo, Path(path).read_bytes())
    names = args.models or ([] if args.tflite else list(MODELS))
    batch = args.batch or 8
    for name in names:
        model_bytes(name, batch)  # convert before any tracing
    for name in names:
        profile(name, batch, args.invokes, dict(args.option), args.hlo)


if __name__ == "__main__":
    main()
