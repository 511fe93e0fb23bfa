"""``kiln quantize MODEL.tflite -o OUT.tflite --mode ...``: quantize any float .tflite.

Wired into the ``kiln`` command by kiln/cli.py through `add_parser`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..errors import KilnError


#: The modes that calibrate on --data; only they take --input-type, --output-type and --integer-only.
CALIBRATED = ("int8", "int16x8", "int4")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``quantize`` subcommand (its modes are `kiln.quant.MODES`)."""
    from . import MODES

    p = subparsers.add_parser(
        "quantize", help=f"post-training quantization of a float .tflite ({', '.join(MODES)})",
        description="Quantize a float LiteRT model with TensorFlow's rules: dynamic range (int8 weights), "
                    "float16 constants, full integer int8 / 16x8 calibrated on a dataset, or kiln's int4 weights "
                    "and weight-only int8.")
    p.add_argument("model", help="float .tflite file (kiln's, TensorFlow's or another exporter's)")
    p.add_argument("-o", "--output", help="output path (default: MODEL_<mode>.tflite in the current directory)")
    p.add_argument("--mode", choices=MODES, default="dynamic",
                   help="int4: kiln's extension, int8 with int4 FC / CONV_2D / DEPTHWISE_CONV_2D weights; weight_only: "
                        "kiln's extension, int8 weights behind DEQUANTIZE, float compute")
    p.add_argument("--data", metavar="FILE.npz|FILE.npy|FILE.tfrecord",
                   help=f"representative dataset for {' / '.join(CALIBRATED)}: an .npz of arrays keyed by input name, "
                        "an .npy for a single-input model, or TF's RepresentativeDataSample TFRecord; one sample per "
                        "row")
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
    from ..format import read_model, write_model
    from ..paths import writable_file, write_bytes
    from .api import quantize_model

    source = Path(args.model)
    out = writable_file(args.output or _default_output(source, args.mode), "-o/--output")
    float_model = source.read_bytes()  # before -o may overwrite it: --debug compares against these bytes
    model = read_model(float_model, name=args.model)
    quantized = [t for sg in model.subgraphs for t in sg.tensors
                 if t.quantization is not None and not t.quantization.is_empty]
    if quantized:
        raise KilnError(f"{args.model} is quantized already ({len(quantized)} tensors carry scales, e.g. "
                        f"{quantized[0].name!r} {quantized[0].dtype.name.lower()}): quantize the float model it came "
                        "from")
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
    if not report.quantized:
        print(f"kiln quantize: warning: --mode {args.mode} quantized nothing in {args.model}: {out} is the float "
              "model" + (" (the reasons above)" if report.kept_float and not args.quiet else ""), file=sys.stderr)
    if args.debug:
        _debug(args, float_model, data)
    return 0


def _default_output(source: Path, mode: str) -> Path:
    """MODEL_<mode>.tflite in the current directory — never beside the input, which may be a served
    model's version directory (models/cnn/1/), where kiln serve would find a second .tflite — and
    refused when the current directory looks like one itself (digits, holding a model)."""
    here = Path.cwd()
    if here.name.isdigit() and (any(here.glob("*.tflite")) or (here / "saved_model.pb").exists()):
        raise KilnError(f"the current directory {str(here)!r} looks like a served model's version directory, where a "
                        "second .tflite would be found by kiln serve: give -o OUT.tflite")
    return Path(f"{source.stem}_{mode}.tflite")


def _debug(args, float_model: bytes, quantized: bytes) -> None:
    """Write the debugger's page and print the ops adding the most error."""
    from ..errors import OpError
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
