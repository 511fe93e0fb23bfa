"""kiln's own kernels on two checkouts, interleaved: the speed a kernel refactor must keep.

Times one invoke of kiln's Interpreter on its own kernels — ``numpy``: the NumPy delegate (no
LiteRT delegate: ``BUILTIN_REF`` + `NumpyDelegate`), ``ref``: the reference kernels alone
(``BUILTIN_REF``), ``xla``: `XlaDelegate` — for float and quantized models, with this
checkout's kiln and with another one's (``--base``, e.g. ``git archive 1e9d4f8 | tar -x -C
/tmp/base``). Each measurement runs in a fresh process with one checkout on ``sys.path``; the
two checkouts take turns (ABBA) for ``--rounds`` rounds, and each row prints the medians and
the median of the per-round ratios new / base (load that changes between rounds cancels out).
The models (bench/runtime_models.py's float ones; kiln.quantize's int8 / 16x8 / dynamic of the
converter zoo's CNN, MobileNetV2 and transformer block) are built once and cached as files,
so both checkouts run the same bytes.

    python bench/kernels_bench.py --base /tmp/base [--rounds 3] [--seconds 2] [--engines numpy ref xla] [case ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("KILN_BENCH_CACHE", "/tmp/kiln_kernels_bench"))
FLOAT = ("mobilenet_v2", "resnet", "transformer")
QUANT = {"cnn": "k3_cnn", "mobilenet": "k3_mobilenet_v2", "transformer": "k3_transformer"}
MODES = ("int8", "int16x8", "dynamic")
#: Cases too slow to time on the reference kernels in a bench's seconds (left out of ``ref``).
CASES = [f"float:{m}" for m in FLOAT] + [f"{mode}:{m}" for m in QUANT for mode in MODES]


def model_path(case: str) -> Path:
    kind, name = case.split(":")
    path = CACHE / f"{kind}-{name}.tflite"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    if kind == "float":
        from bench import runtime_models

        data = runtime_models.model_bytes(name, "kiln", False)
    else:
        import kiln
        from tests.converter import zoo

        keras_model = zoo.BUILDERS[QUANT[name]]().obj
        rng = np.random.default_rng(3)
        shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
        calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(8)]
        with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
            float_model = kiln.TFLiteConverter.from_keras_model(keras_model).convert()
        data = kiln.quantize(float_model, kind, progress=False,
                             representative_dataset=lambda: ([d] for d in calibration))
    path.write_bytes(data)
    return path


def worker(case: str, engine: str, seconds: float) -> None:
    """One measurement, in this process's kiln: median ms per invoke, as JSON on stdout."""
    import kiln

    data = model_path(case).read_bytes()
    ref = kiln.OpResolverType.BUILTIN_REF
    if engine == "numpy":
        interp = kiln.Interpreter(model_content=data, experimental_op_resolver_type=ref,
                                  experimental_delegates=[kiln.delegates.NumpyDelegate()])
    elif engine == "ref":
        interp = kiln.Interpreter(model_content=data, experimental_op_resolver_type=ref)
    else:
        from kiln.xla import XlaDelegate

        interp = kiln.Interpreter(model_content=data, experimental_op_resolver_type=ref,
                                  experimental_delegates=[XlaDelegate()])
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        x = rng.uniform(-1, 1, d["shape"]).astype(d["dtype"]) if np.dtype(d["dtype"]).kind == "f" else \
            rng.integers(-100, 100, d["shape"]).astype(d["dtype"])
        interp.set_tensor(d["index"], x)
    for _ in range(3):
        interp.invoke()
    start = time.perf_counter()
    interp.invoke()
    once = max(time.perf_counter() - start, 1e-6)
    batch = max(1, int(0.05 / once))
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        start = time.perf_counter()
        for _ in range(batch):
            interp.invoke()
        samples.append((time.perf_counter() - start) / batch)
    out = interp.get_tensor(interp.get_output_details()[0]["index"])
    print(json.dumps({"ms": 1e3 * float(np.median(samples)), "digest": float(np.asarray(out, np.float64).sum())}))


def measure(checkout: Path, case: str, engine: str, seconds: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", case, engine, str(seconds)],
                          env=env, capture_output=True, text=True, cwd=str(checkout))
    if proc.returncode:
        raise SystemExit(f"{checkout} {case} {engine} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"default: all of {CASES}")
    parser.add_argument("--base", type=Path, help="the other checkout (its root)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--engines", nargs="+", default=["numpy", "ref", "xla"])
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], float(args.worker[2]))
        return
    if args.base is None:
        raise SystemExit("--base CHECKOUT is required")
    cases = args.cases or CASES
    for case in cases:
        model_path(case)
    print(f"{'case':<24} {'engine':<6} {'base ms':>9} {'new ms':>9} {'new/base':>9}  same output  (load {os.getloadavg()[0]:.1f})")
    for case in cases:
        for engine in args.engines:
            if engine == "ref" and case in ("float:resnet",):
                continue
            base, new, ratios, same = [], [], [], True
            for r in range(args.rounds):
                order = [("base", args.base), ("new", ROOT)]
                if r % 2:
                    order.reverse()
                got = {name: measure(path, case, engine, args.seconds) for name, path in order}
                base.append(got["base"]["ms"])
                new.append(got["new"]["ms"])
                ratios.append(got["new"]["ms"] / got["base"]["ms"])
                same &= got["new"]["digest"] == got["base"]["digest"]
            print(f"{case:<24} {engine:<6} {np.median(base):>9.3f} {np.median(new):>9.3f} {np.median(ratios):>8.3f}x  "
                  f"{'yes' if same else 'NO'}  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
