"""The ``kiln`` command: inspect, run and benchmark .tflite models (and convert, with TensorFlow).

    kiln inspect MODEL                      structure, versions, signatures, size by section
    kiln run MODEL [--input NAME=FILE.npy]  run once (random inputs by default), save outputs
    kiln benchmark MODEL [--runs N]         latency statistics and a per-op profile
    kiln xla-export MODEL [--batch-sizes]   save the XLA delegate's compiled partitions (MODEL.xla)
    kiln convert ...                        TensorFlow -> .tflite (kiln.converter.cli)
    kiln serve --model_base_path DIR        TF Serving's REST API with batching (kiln.serve.cli)

The runtime commands need only NumPy, flatbuffers and the schema bindings; TensorFlow is
imported only by ``kiln convert`` and ``kiln infer-convert``. Arguments are checked before any
work (kiln/cli_checks.py); a user error ends in one ``kiln CMD: error: ...`` line, exit 1 (2
for a malformed command line), Ctrl-C in ``kiln CMD: interrupted``, exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import cli_checks, extras
from .errors import KilnError

DELEGATES = ("default", "reference", "xla")
#: The names --delegate had before "default" / "reference" (still accepted).
_OLD_DELEGATE_NAMES = {"compiled": "default", "none": "reference"}
DELEGATE_HELP = ("default: what kiln.Interpreter() runs by default (its default delegates, the reference kernels "
                 "for the nodes they leave); reference: the reference kernels alone (OpResolverType.BUILTIN_REF), "
                 "one profile row per op; xla: the XLA delegate, then the default ones")


def _delegate_choice(text: str) -> str:
    return _OLD_DELEGATE_NAMES.get(text, text)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (``kiln run: error: ...``), as kiln's own errors."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- shared helpers --------------------------------------------------------------------------

def _load(path: str):
    from .format import read_model

    return read_model(path)


def _open_interpreter(path: str, delegate: str):
    """The model's interpreter from `kiln.runtime.open` (the one place that maps a backend to
    an interpreter): "default" is exactly ``kiln.Interpreter(model)`` (so it follows the
    runtime's default); "reference" the reference kernels alone (BUILTIN_REF); "xla" the XLA
    delegate first, the default delegates after it."""
    from . import runtime
    from .runtime import OpResolverType

    resolver = OpResolverType.BUILTIN_REF if delegate == "reference" else None
    return runtime.open(path, "xla" if delegate == "xla" else "kiln", op_resolver_type=resolver).make_interpreter()


def backend_lines(interp, verbose: bool = False) -> list[str]:
    """Which delegate ran how many nodes of each subgraph that ran, and the reference kernels
    the rest (with ``verbose``, every node, and why each delegate refused a node it left).

    Read from the interpreter's plans, so it follows whatever delegates the interpreter holds.
    """
    delegates = list(getattr(interp, "_delegates", ()))
    names = ", ".join(getattr(d, "name", type(d).__name__) for d in delegates) or "none"
    lines = [f"backend: delegates offered every node, in order: {names}"]
    for index, env in sorted(getattr(interp, "_envs", {}).items()):
        if env.steps is None:
            continue
        by_backend: dict[str, list[int]] = defaultdict(list)
        per_node = []
        for step in env.steps:
            nodes = range(step.index, step.index + len(step.op_names))
            backend = f"{step.delegate} delegate" if step.delegate else "reference kernels"
            by_backend[backend] += list(nodes)
            for node, op_name in zip(nodes, step.op_names):
                per_node.append((node, op_name, backend))
        total = len(per_node)
        parts = [f"{backend} {len(nodes)}" for backend, nodes in
                 sorted(by_backend.items(), key=lambda kv: (kv[0] == "reference kernels", -len(kv[1])))]
        lines.append(f"  subgraph {index}: {total} node{'s' if total != 1 else ''}: " + ", ".join(parts))
        if not verbose:
            continue
        ops = env.sg.operators
        for node, op_name, backend in per_node:
            why = ""
            if backend == "reference kernels":
                key = (node, ops[node].name, ops[node].version)
                reasons = [f"{d.name}: {d.rejected[key]}" for d in delegates
                           if isinstance(getattr(d, "rejected", None), dict) and key in d.rejected]
                why = f"  ({'; '.join(reasons)})" if reasons else ""
            lines.append(f"    node {node:>4} {op_name} v{ops[node].version}: {backend}{why}")
    return lines


def _dims(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _type_name(dtype) -> str:
    return np.dtype(dtype).name if np.dtype(dtype).kind != "O" else "object"


def _random_input(shape, dtype, rng) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = [max(int(d), 1) for d in shape]  # a dynamic (-1) dim runs with 1
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise KilnError(f"cannot make a random input of type {dtype}; pass it with --input NAME=FILE.npy")


def _bytes(n: int) -> str:
    return f"{n:,} B"


# -- inspect ---------------------------------------------------------------------------------

def _sections(data: bytes) -> dict:
    """Bytes of constant data, metadata and flatbuffer tables (the rest: tables, padding)."""
    from tflite.Model import Model as FbModel

    fb = FbModel.GetRootAs(data, 0)
    sizes = []
    for i in range(fb.BuffersLength()):
        b = fb.Buffers(i)
        sizes.append(b.Size() if b.Offset() > 1 else b.DataLength())
    meta = {fb.Metadata(i).Buffer() for i in range(fb.MetadataLength())}
    metadata = sum(sizes[i] for i in meta if i < len(sizes))
    constants = sum(sizes) - metadata
    return {"constants": constants, "metadata": metadata, "tables": len(data) - constants - metadata,
            "buffers": sum(1 for i, s in enumerate(sizes) if s and i not in meta)}


def _min_runtime(model) -> str:
    raw = model.metadata.get("min_runtime_version")
    if raw is None:
        return "(no min_runtime_version metadata)"
    return raw.split(b"\0", 1)[0].decode("ascii", "replace") or "(empty)"


def _tensor_line(i: int, t) -> str:
    sig = "" if t.shape_signature is None else f" signature {_dims(t.shape_signature)}"
    extra = []
    if t.is_variable:
        extra.append("variable")
    if t.is_constant:
        extra.append(f"const {t.data.nbytes:,} B")
    if t.quantization is not None and not t.quantization.is_empty:
        q = t.quantization
        extra.append(f"quantized ({len(q.scale)} scale{'s' if len(q.scale) != 1 else ''})")
    tail = f"  ({', '.join(extra)})" if extra else ""
    return f"{i:>5}  {t.dtype.name.lower():<9} {_dims(t.shape):<18}{sig} {t.name!r}{tail}"


def cmd_inspect(args) -> int:
    model = _load(args.model)  # validates (and names a missing file) before anything else
    data = Path(args.model).read_bytes()
    sec = _sections(data)
    total = len(data)
    print(f"{args.model}: {total:,} bytes, schema version {model.version}, description {model.description!r}")
    print(f"minimum runtime version: {_min_runtime(model)}")
    print("size by section:")
    for label, key, note in (("constants", "constants", f"{sec['buffers']} buffers"),
                             ("flatbuffer tables", "tables", "tables, strings, padding"),
                             ("metadata", "metadata", ", ".join(model.metadata) or "none")):
        share = 100.0 * sec[key] / total if total else 0.0
        print(f"  {label:<18} {_bytes(sec[key]):>16} {share:6.1f}%  ({note})")
    if model.signatures:
        print("signatures:")
        for s in model.signatures:
            index = model.subgraph_index(s.subgraph)
            pos = s.subgraph.tensor_index()
            print(f"  {s.key!r} (subgraph {index})")
            for kind, items in (("input ", s.inputs), ("output", s.outputs)):
                for name, t in items.items():
                    print(f"    {kind} {name!r} -> tensor {pos[id(t)]} {t.dtype.name.lower()} {_dims(t.signature)}")
    for si, sg in enumerate(model.subgraphs):
        pos = sg.tensor_index()
        print(f"subgraph {si} {sg.name!r}: {len(sg.operators)} operators, {len(sg.tensors)} tensors")
        for kind, ts in (("inputs ", sg.inputs), ("outputs", sg.outputs)):
            print(f"  {kind}: " + ", ".join(f"{pos[id(t)]} {t.name!r} {t.dtype.name.lower()} {_dims(t.signature)}"
                                            for t in ts))
        counts: dict[str, int] = defaultdict(int)
        for op in sg.operators:
            counts[f"{op.name} v{op.version}"] += 1
        print("  op counts: " + (", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
                                 or "none"))
        if args.summary:
            continue
        print("  operators:")
        for oi, op in enumerate(sg.operators):
            ins = [-1 if t is None else pos[id(t)] for t in op.inputs]
            outs = [-1 if t is None else pos[id(t)] for t in op.outputs]
            kind = f"CUSTOM {op.name!r}" if op.op_type == "CUSTOM" else op.name
            print(f"  {oi:>5}  {kind:<28} v{op.version:<3} {ins} -> {outs}")
        print("  tensors:")
        for ti, t in enumerate(sg.tensors):
            print("  " + _tensor_line(ti, t))
    return 0


# -- run -------------------------------------------------------------------------------------

def _parse_inputs(items) -> dict[str, np.ndarray]:
    from .paths import read_npy

    out = {}
    for item in items or ():
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise KilnError(f"--input expects NAME=FILE.npy, got {item!r}")
        if name in out:
            raise KilnError(f"--input {name} is given twice; give each input once")
        out[name] = read_npy(path, f"--input {name}")
    return out


def _match_inputs(given: dict, inputs: dict) -> dict:
    """``given`` (``--input`` keys) keyed by the inputs they name: ``inputs`` maps each input's key
    to the names it answers to (signature name, tensor name, tensor index)."""
    alias = {name: key for key, names in inputs.items() for name in names}
    unknown = sorted(set(given) - set(alias))
    if unknown:
        raise KilnError(f"the model has no input(s) {unknown}; its inputs (by name, tensor name or tensor "
                        f"index) are {[list(names) for names in inputs.values()]}")
    out, named = {}, {}
    for name, value in given.items():
        if alias[name] in out:
            raise KilnError(f"--input {named[alias[name]]} and --input {name} name the same input; give each input "
                            "once")
        out[alias[name]], named[alias[name]] = value, name
    return out


def _pick_signature(interp, key):
    sigs = interp.get_signature_list()
    if key is not None:
        return interp.get_signature_runner(key), key
    if len(sigs) == 1:
        key = next(iter(sigs))
        return interp.get_signature_runner(key), key
    return None, None


def cmd_run(args) -> int:
    interp = _open_interpreter(args.model, args.delegate)
    given = _parse_inputs(args.input)
    rng = np.random.default_rng(args.seed)
    runner, key = _pick_signature(interp, args.signature)
    if runner is not None:
        details = runner.get_input_details()
        given = _match_inputs(given, {n: dict.fromkeys((n, d["name"], str(d["index"]))) for n, d in details.items()})
        print(f"signature {key!r}:")
        feeds = {}
        for name, d in details.items():
            feeds[name] = given[name] if name in given else _random_input(d["shape_signature"], d["dtype"], rng)
            _describe_input(name, feeds[name], name in given)
        outputs = runner(**feeds)
    else:
        print("invoke():")
        details = interp.get_input_details()
        values = _match_inputs(given, {d["index"]: dict.fromkeys((d["name"], str(d["index"]))) for d in details})
        fed = set(values)
        for d in details:
            values.setdefault(d["index"], _random_input(d["shape_signature"], d["dtype"], rng))
            if tuple(d["shape"]) != values[d["index"]].shape:
                interp.resize_tensor_input(d["index"], values[d["index"]].shape)
        interp.allocate_tensors()
        for d in details:
            value = values[d["index"]]
            interp.set_tensor(d["index"], value)
            _describe_input(d["name"], value, d["index"] in fed)
        interp.invoke()
        outputs = {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}
    print("outputs:")
    for name, value in outputs.items():
        flat = np.asarray(value).reshape(-1)
        shown = np.array2string(flat[:args.show], precision=5, separator=", ", threshold=args.show + 1,
                                max_line_width=10_000)
        more = f" ... ({flat.size} values)" if flat.size > args.show else ""
        print(f"  {name!r} {_type_name(value.dtype)} {_dims(value.shape)}: {shown}{more}")
    for line in backend_lines(interp, args.verbose):
        print(line)
    if args.output_dir:
        from .paths import write_bytes

        out_dir = Path(args.output_dir)
        for name, value in outputs.items():
            path = out_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + ".npy")
            buffer = io.BytesIO()
            np.save(buffer, value)
            write_bytes(path, buffer.getvalue(), "--output-dir")
            print(f"saved {path}")
    return 0


def _describe_input(name, value, given: bool) -> None:
    origin = "given" if given else "random"
    print(f"  input {name!r} {_type_name(value.dtype)} {_dims(value.shape)} ({origin})")


# -- benchmark -------------------------------------------------------------------------------

def _percentile(sorted_ms, q: float) -> float:
    return float(np.percentile(sorted_ms, q))


def _op_key(event) -> str:
    if event.delegate is not None:
        return f"{event.delegate} delegate ({len(event.op_names)} nodes)"
    return event.op_names[0]


def profile_table(events, runs: int) -> list[str]:
    """LiteRT-style summary by node type, one block per subgraph (times are per run)."""
    lines = []
    by_subgraph: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    nodes: dict[int, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for e in events:
        row = by_subgraph[e.subgraph][_op_key(e)]
        row[0] += 1
        row[1] += e.seconds
        nodes[e.subgraph][_op_key(e)].add(e.node)
    for sg in sorted(by_subgraph):
        rows = sorted(by_subgraph[sg].items(), key=lambda kv: -kv[1][1])
        total = sum(r[1] for _, r in rows) or 1e-12
        title = "subgraph 0" if sg == 0 else f"subgraph {sg} (runs inside a control-flow op above)"
        lines.append(f"per-op profile, {title}, averaged over {runs} runs:")
        lines.append(f"  {'op type':<34} {'count':>5} {'total ms':>10} {'%':>7} {'cdf %':>7} {'calls/run':>10}")
        cdf = 0.0
        for key, (calls, seconds) in rows:
            share = 100.0 * seconds / total
            cdf += share
            lines.append(f"  {key:<34} {len(nodes[sg][key]):>5} {seconds / runs * 1e3:>10.3f} {share:>6.1f}% "
                         f"{cdf:>6.1f}% {calls / runs:>10.1f}")
    return lines


def cmd_benchmark(args) -> int:
    interp = _open_interpreter(args.model, args.delegate)
    rng = np.random.default_rng(args.seed)
    runner, key = _pick_signature(interp, args.signature) if args.signature else (None, None)
    if runner is not None:
        feeds = {n: _random_input(d["shape_signature"], d["dtype"], rng) for n, d in runner.get_input_details().items()}
        runner(**feeds)  # sizes and allocates the signature's subgraph

        def invoke():
            runner(**feeds)
    else:
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], _random_input(d["shape"], d["dtype"], rng))
        invoke = interp.invoke
    if args.delegate == "xla":  # the first invoke compiles: reported on its own, not timed below
        first = time.perf_counter()
        invoke()
        first_ms = (time.perf_counter() - first) * 1e3
    where = f"signature {key!r}" if key else "invoke()"
    print(f"{args.model}: {where}, delegate: {args.delegate}", flush=True)  # shown while it runs
    for _ in range(args.warmup):
        invoke()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        invoke()
        times.append((time.perf_counter() - start) * 1e3)
    ms = np.sort(np.array(times))
    for line in backend_lines(interp, args.verbose):
        print(line)
    print(f"latency over {args.runs} warm runs ({args.warmup} warm-up), ms: "
          f"mean {ms.mean():.3f}  std {ms.std():.3f}  min {ms[0]:.3f}  p50 {_percentile(ms, 50):.3f}  "
          f"p90 {_percentile(ms, 90):.3f}  max {ms[-1]:.3f}")
    if args.delegate == "xla":
        xla = interp._delegates[0]
        print(f"first invoke {first_ms:.1f} ms, of which XLA trace + compile {xla.compile_seconds * 1e3:.1f} ms "
              f"({len(xla.kernels)} partitions, {len(xla.claimed)} nodes claimed, "
              f"{len(xla.rejected)} left on the reference kernels)")
    if args.profile:
        events = []
        interp.profiler = events.append
        for _ in range(args.runs):
            invoke()
        interp.profiler = None
        for line in profile_table(events, args.runs):
            print(line)
    return 0


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of batch sizes") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes are positive ints, e.g. 1,8,64")
    return sizes


def cmd_xla_export(args) -> int:
    import json
    import zipfile

    from .xla.exported import export_model

    start = time.perf_counter()
    path = export_model(args.model, args.output, batch_sizes=args.batch_sizes, dtype_policy=args.dtype_policy,
                        device=args.device, weights=args.weights)
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
    print(f"{path}: {Path(path).stat().st_size / 1e6:.2f} MB in {time.perf_counter() - start:.1f} s, for "
          f"{manifest['platform']}, dtype_policy {manifest['dtype_policy']}; weights stored "
          f"{manifest['stored_weight_bytes'] / 1e6:.2f} MB (the others are read from the model)")
    for p in manifest["partitions"] + manifest["skipped"]:
        shapes = ", ".join(str([shape for shape, _ in e["inputs"]]) for e in p.get("entries", ()))
        print(f"  nodes {p['nodes'][0]}..{p['nodes'][-1]}: " + (f"inputs {shapes}" if shapes else p.get("reason", "")))
    return 0


# -- convert (TensorFlow) --------------------------------------------------------------------

def _converter_cli():
    """kiln.converter.cli when it exists (it defines add_parser / run), else None."""
    try:
        return importlib.import_module("kiln.converter.cli")
    except ModuleNotFoundError as exc:
        if exc.name in ("kiln.converter.cli",):
            return None
        raise


def _no_converter(args) -> int:
    raise KilnError("this kiln has no converter command (kiln.converter.cli is missing)")


# -- main ------------------------------------------------------------------------------------

def version() -> str:
    """``kiln X.Y.Z from DIR (Python A.B.C)``: the installed distribution's version (kiln's own
    when it runs from a source tree that is not installed) and the package that answers."""
    from importlib import metadata

    from . import __version__

    try:
        number = metadata.version("kiln")
    except metadata.PackageNotFoundError:
        number = __version__
    return f"kiln {number} from {Path(__file__).resolve().parent} (Python {sys.version.split()[0]})"


class _Version(argparse.Action):
    """``--version``, its text made only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print kiln's version and where it is installed, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(version() + "\n")
        parser.exit(0)


def build_parser(with_convert: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(prog="kiln", description="Inspect, run, benchmark and convert LiteRT models.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("inspect", help="subgraphs, operators and versions, tensors, signatures, sizes")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--summary", action="store_true", help="leave out the operator and tensor lists")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("run", help="run a model once and print / save its outputs")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input by signature name, tensor name or tensor index (as kiln inspect lists them), "
                        "from a .npy file (np.save); once per input; the others are random")
    p.add_argument("--signature", metavar="KEY", help="signature to run (default: the only one, if any)")
    p.add_argument("--output-dir", metavar="DIR", help="save every output as DIR/<name>.npy")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--show", type=int, default=8, help="values to print per output (default 8)")
    p.add_argument("--delegate", type=_delegate_choice, choices=DELEGATES, default="default", help=DELEGATE_HELP)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every node's backend (and why a delegate left it to the reference kernels)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("benchmark", help="latency statistics over warm runs and a per-op profile")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--runs", type=int, default=50, help="timed runs (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--signature", metavar="KEY", help="benchmark a signature runner instead of invoke()")
    p.add_argument("--delegate", type=_delegate_choice, choices=DELEGATES, default="default", help=DELEGATE_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-op profile")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every node's backend (and why a delegate left it to the reference kernels)")
    p.set_defaults(func=cmd_benchmark)

    p = sub.add_parser("xla-export", help="save the XLA delegate's compiled partitions next to the model "
                                          "(serialized StableHLO), to load without tracing")
    p.add_argument("model", help=".tflite file")
    p.add_argument("--output", metavar="PATH", help="where to write it (default: MODEL.xla, where kiln serve and "
                                                   "kiln.runtime.open look for it)")
    p.add_argument("--batch-sizes", type=_batch_sizes, metavar="B,B,...",
                   help="batch buckets to compile for (the free first dimension; default: the model's own shape)")
    p.add_argument("--dtype-policy", choices=("float32", "bfloat16"), help="XlaDelegate's dtype_policy")
    p.add_argument("--device", help="cpu, gpu, ... (default: JAX's default device); the export is for its platform")
    p.add_argument("--weights", choices=("arguments", "constants"),
                   help="XlaDelegate's weights (default: arguments, or literals for small models on a CPU)")
    p.set_defaults(func=cmd_xla_export)

    from .quant import cli as quant_cli

    quant_cli.add_parser(sub)
    importlib.import_module("kiln.inference.cli").add_parser(sub)  # kiln infer-convert (TF imported lazily)
    importlib.import_module("kiln.serve.cli").add_parser(sub)  # kiln serve (its HTTP stack imported on use)

    converter = _converter_cli() if with_convert else None
    if converter is not None:
        converter.add_parser(sub)
    else:
        p = sub.add_parser("convert", help="convert a TensorFlow model to .tflite (needs TensorFlow)",
                           add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_no_converter)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with_convert = bool(argv) and argv[0] == "convert"
    prefix = f"kiln {argv[0]}" if argv and not argv[0].startswith("-") else "kiln"
    try:
        parser = build_parser(with_convert)
        args = parser.parse_args(argv)
        cli_checks.check(args.command, args)
        if args.command == "infer-convert":  # kiln convert does this itself, after its own checks
            from .converter.tfutil import import_tensorflow_quietly

            import_tensorflow_quietly()
        if args.command == "convert" and args.func is not _no_converter:
            return int(_converter_cli().run(args) or 0)
        return int(args.func(args) or 0)
    except KilnError as exc:
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (cli_checks.UsageError, extras.MissingExtraError)) else 1
    except ImportError as exc:  # an extra's module no check foresaw: still one line naming the pip command
        missing = extras.from_import_error(exc, "")
        if missing is None:
            raise
        print(f"{prefix}: error: {missing}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kiln inspect big.tflite | head`
        return 0
    except OSError as exc:  # a file-system error no check foresaw: the OS's words and the path
        where = f": {exc.filename!r}" if getattr(exc, "filename", None) else ""
        print(f"{prefix}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
