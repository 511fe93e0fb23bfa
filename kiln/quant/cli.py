"""``kiln quantize MODEL.tflite -o OUT.tflite --mode ...``: quantize any float .tflite.

Wired into the ``kiln`` command by kiln/cli.py through `add_parser`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``quantize`` subcommand."""
    p = subparsers.add_parser(
        "quantize", help="post-training quantization of a float .tflite (dynamic, float16, int8, int16x8)",
        description="Quantize a float LiteRT model with TensorFlow's rules: dynamic range (int8 weights), "
                    "float16 constants, or full integer int8 / 16x8 calibrated on a dataset.")
    p.add_argument("model", help="float .tflite file (kiln's, TensorFlow's or another exporter's)")
    p.add_argument("-o", "--output", help="output path (default: MODEL with _<mode>.tflite)")
    p.add_argument("--mode", choices=("dynamic", "float16", "int8", "int16x8", "int4", "weight_only"),
                   default="dynamic", help="int4: kiln's extension, int8 with int4 FC / CONV_2D / DEPTHWISE_CONV_2D weights")
    p.add_argument("--data", metavar="FILE.npz|FILE.tfrecord",
                   help="representative dataset for int8 / int16x8 / int4: arrays keyed by input name, "
                        "one sample per row")
    p.add_argument("--allow-integer-samples", action="store_true",
                   help="accept integer --data arrays for float inputs as they are (by default refused: "
                        "usually un-normalised data, e.g. uint8 images for a model that takes [0, 1])")
    p.add_argument("--denylist", nargs="+", default=(), metavar="OP_OR_TENSOR",
                   help="op types (CONV_2D) or output tensor names to keep float")
    p.add_argument("--integer-only", action="store_true",
                   help="int8 / int16x8: refuse ops without an integer kernel instead of keeping them float")
    p.add_argument("--input-type", choices=("float32", "int8", "uint8", "int16"), default="float32")
    p.add_argument("--output-type", choices=("float32", "int8", "uint8", "int16"), default="float32")
    p.add_argument("--debug", metavar="REPORT.html",
                   help="compare the quantized model with the float one over --data and write the "
                        "quantization debugger's page (per-op error chart); prints the worst ops")
    p.add_argument("--debug-runner", choices=("kiln", "litert"), default="kiln",
                   help="what runs the models for --debug: kiln's Interpreter or LiteRT's reference kernels")
    p.add_argument("--debug-target", type=float, metavar="MAX_ERROR",
                   help="with --debug: search the ops to keep float so the outputs' max |error| is at most "
                        "MAX_ERROR, and print them as a --denylist")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from ..errors import KilnError
    from ..format import read_model, write_model
    from ..paths import writable_file, write_bytes
    from .api import quantize_model

    if args.mode in ("int8", "int16x8", "int4") and not args.data:
        raise KilnError(f"--mode {args.mode} needs --data FILE.npz or FILE.tfrecord (the representative dataset)")
    if args.debug and not args.data:
        raise KilnError("--debug needs --data FILE.npz or FILE.tfrecord (the samples both models are compared on)")
    if args.debug_target is not None and not args.debug:
        raise KilnError("--debug-target needs --debug REPORT.html")
    source = Path(args.model)
    out = writable_file(args.output or source.with_name(f"{source.stem}_{args.mode}.tflite"), "-o/--output")
    float_model = source.read_bytes()  # before -o may overwrite it: --debug compares against these bytes
    model = read_model(float_model)
    report = quantize_model(model, args.mode, representative_dataset=args.data, denylist=args.denylist,
                            integer_only=args.integer_only, inference_input_type=args.input_type,
                            inference_output_type=args.output_type, progress=not args.quiet,
                            allow_integer_samples=args.allow_integer_samples)
    data = write_model(model)
    write_bytes(out, data, "-o/--output")
    if not args.quiet:
        before = len(float_model)
        print(f"{out}: {len(data):,} bytes ({len(data) / before:.2f} of {before:,}), mode {report.mode}, "
              f"{len(report.quantized)} tensors quantized")
        for op, name in report.rewritten:
            print(f"  rewritten: {op} '{name}' as its integer equivalent")
        for op, name, why in report.kept_float:
            print(f"  kept float: {op} '{name}': {why}")
    if args.debug:
        _debug(args, float_model, data)
    return 0


def _debug(args, float_model: bytes, quantized: bytes) -> None:
    """Write the debugger's page and print the ops adding the most error."""
    from ..errors import KilnError, OpError
    from .debug import QuantizationDebugger

    debugger = QuantizationDebugger(float_model, quantized, args.data, runner=args.debug_runner,
                                    allow_integer_samples=args.allow_integer_samples)
    try:
        debugger.to_html(args.debug)
    except OpError as exc:
        if args.debug_runner != "kiln":
            raise
        raise KilnError(f"{exc}; --debug-runner litert runs the models in LiteRT instead") from exc
    if args.quiet:
        return
    print(f"{args.debug}: quantization debugger report over {len(debugger.samples)} samples")
    for o in debugger.outputs:
        top1 = "" if o.top1_agreement is None else f", top-1 agreement {o.top1_agreement:.1%}"
        print(f"  output '{o.name}': max |error| {o.errors.max_abs_error:.3g}{top1}")
    print("  ops adding the most error (layer-wise relative error):")
    for r in debugger.worst_ops(5):
        print(f"    #{r.op_index} {r.op} '{r.tensor}': {r.added_error:.3g}")
    if args.debug_target is None:
        return
    found = debugger.suggest_denylist(args.debug_target, mode=args.mode, base_denylist=args.denylist)
    verdict = "meets" if found.reached else "does not reach"
    print(f"  keeping {len(found.denylist)} op(s) float {verdict} max |error| {args.debug_target:g} "
          f"({found.error:.3g}, {len(found.trials)} re-quantizations):")
    if found.denylist:
        print("    --denylist " + " ".join(shlex.quote(n) for n in list(args.denylist) + found.denylist))
