"""kiln + XlaDelegate on quantized models, against LiteRT and kiln's default runtime.

Models: kiln's int8 and 16x8 quantizations (kiln.quantize over kiln's float conversion) of the
converter zoo's CNN, MobileNetV2 alpha=0.35, transformer block and LSTM, at batch 1 and 8
(`resize_tensor_input`). Engines take turns in short rounds (a busy machine slows them alike):
LiteRT's default (XNNPACK for int8, its built-in kernels for 16x8; one thread), kiln's
default Interpreter (its NumPy quantized delegate) and kiln with an XlaDelegate (single-
threaded XLA). Printed: median and fastest-round ms per invoke (bench/xla_bench.py's
`interleaved`), ratios to LiteRT, the XLA trace + compile time, and whether kiln + XLA equals LiteRT's BUILTIN_REF bit for bit.

    python bench/xla_quant_bench.py [--seconds 2] [--batches 1 8] [--modes int8 int16x8] [model ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from xla_bench import interleaved  # noqa: E402

MODELS = {"cnn": "k3_cnn", "mobilenet": "k3_mobilenet_v2", "transformer": "k3_transformer", "lstm": "k3_lstm"}


def quantized(name: str, mode: str) -> bytes:
    from tests.converter import zoo

    keras_model = zoo.BUILDERS[name]().obj
    rng = np.random.default_rng(3)
    shape = (1,) + tuple(keras_model.inputs[0].shape[1:])
    calibration = [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(8)]
    with contextlib.redirect_stdout(io.StringIO()), zoo._silent_fd2():
        float_model = kiln.TFLiteConverter.from_keras_model(keras_model).convert()
    return kiln.quantize(float_model, mode, progress=False, representative_dataset=lambda: ([d] for d in calibration))


def prepared(interp, batch):
    d = interp.get_input_details()[0]
    shape = [batch, *d["shape"][1:]]
    interp.resize_tensor_input(d["index"], shape)
    interp.allocate_tensors()
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    return interp


def output(interp):
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def main() -> None:
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS), help=f"default: all of {list(MODELS)}")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per row (default 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--modes", nargs="+", default=["int8", "int16x8"])
    args = parser.parse_args()
    print("| model | mode | batch | LiteRT ms median / best | kiln default ms | kiln + XLA ms median / best "
          "| default ÷ LiteRT | XLA ÷ LiteRT median / best | XLA compile s | XLA = BUILTIN_REF |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in args.models:
        for mode in args.modes:
            model = quantized(MODELS[key], mode)
            for batch in args.batches:
                delegate = XlaDelegate()
                engines = {"litert": prepared(LiteRT(model_content=model, num_threads=1), batch),
                           "kiln": prepared(kiln.Interpreter(model_content=model), batch),
                           "xla": prepared(kiln.Interpreter(model_content=model, experimental_delegates=[delegate]),
                                           batch)}
                got = output(engines["xla"])
                # Resizing compiles already (allocate_tensors runs the partitions for their shapes).
                compile_s = delegate.compile_seconds
                ref = prepared(LiteRT(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF),
                               batch)
                exact = np.array_equal(got, output(ref)) and not delegate.rejected
                for interp in engines.values():
                    output(interp)
                ms = interleaved(engines, args.seconds, best=True)
                print(f"| {key} | {mode} | {batch} | {ms['litert']:.3f} / {ms['litert_best']:.3f} | {ms['kiln']:.3f} "
                      f"| {ms['xla']:.3f} / {ms['xla_best']:.3f} | {ms['kiln'] / ms['litert']:.1f}× "
                      f"| {ms['xla'] / ms['litert']:.1f}× / {ms['xla_best'] / ms['litert_best']:.1f}× | {compile_s:.1f} "
                      f"| {'yes' if exact else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
