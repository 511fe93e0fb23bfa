"""One served-model layer: open a model on a backend and run its signatures by name.

`kiln serve`, the Beam handler and the command line all need the same things from a model:
its signatures with the specs of their inputs and outputs, and a runner per thread that maps
``{input name: array}`` to ``{output name: array}``. `open` gives them for a ``.tflite`` file
(on kiln's Interpreter, LiteRT's or kiln's with the XLA delegate) or a SavedModel (on
TensorFlow). Interpreters are not thread-safe, so every thread asks `ServedModel.new_runner`
for its own; the interpreters of one model share its weights.

Nothing here imports TensorFlow, LiteRT or JAX until a backend that needs them is opened. The
``xla`` backend lives in a higher layer (`kiln.xla`): that layer registers it here
(`register_backend`, called by kiln/__init__.py), so the runtime never imports upward.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import ops
from ..errors import InterpreterError, KilnError, ModelError, UnsupportedError
from ..schema import DType

BACKENDS = ("kiln", "litert", "xla", "tf")
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
#: kiln interpreters a runner keeps, one per input-shape set (they share the model's weights):
#: a batch size seen before runs without re-planning. LiteRT and XLA runners resize one
#: interpreter instead (a LiteRT interpreter holds its own packed copy of the weights).
SHAPE_CACHE = 8
#: Compiled XLA functions an XLA interpreter keeps (one per input shape).
XLA_SHAPES = 16
#: Backends of kiln's Interpreter that a higher layer provides: name -> ``load(batch_sizes,
#: model_path)`` (the .tflite's path, None for bytes), called when a model is opened on it (raising if the backend cannot run here), returning a
#: function that gives each new interpreter its delegates (prepared for those batch buckets).
_DELEGATE_BACKENDS: dict[str, Callable[..., Callable[[], list]]] = {}


def register_backend(name: str, load: Callable[..., Callable[[], list]]) -> None:
    """Make ``open(model, backend=name)`` run kiln's Interpreter with the delegates ``load()``
    provides (`kiln.xla`'s "xla" is registered by kiln/__init__.py)."""
    if name not in BACKENDS:
        raise UnsupportedError(f"register_backend: {name!r} is not one of the backends {', '.join(BACKENDS)}")
    _DELEGATE_BACKENDS[name] = load


def _passes_values(op) -> bool:
    """The op hands its first input's values on unchanged, so an index keeps its meaning: a
    reshape (the record says so) or a CAST between integer types."""
    record = ops.get(op.op_type)
    return record is not None and (record.reshapes or op.op_type == "CAST")


class SignatureNotFound(InterpreterError, LookupError):
    """A signature key the model does not have (the message lists the ones it has)."""


@dataclass(frozen=True)
class TensorSpec:
    """A signature input or output.

    ``dtype`` is object for strings; ``shape`` holds -1 for free dimensions (None: any rank);
    ``index_range`` is ``(low, high)`` when the model indexes a table with the input's values,
    which must then lie in ``[low, high)``.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] | None
    tensor_name: str = ""
    index_range: tuple[int, int] | None = None

    @property
    def is_string(self) -> bool:
        return self.dtype.kind in "OSU"

    def out_of_range(self, values: np.ndarray):
        """The first value outside ``index_range`` (None when all are inside or there is no range)."""
        if self.index_range is None or values.size == 0 or values.dtype.kind not in "iu":
            return None
        low, high = self.index_range
        if int(values.min()) >= low and int(values.max()) < high:
            return None
        flat = values.reshape(-1)
        return int(flat[(flat < low) | (flat >= high)][0])


@dataclass(frozen=True, eq=False)
class Signature:
    """A signature's inputs and outputs by their names, in the model's order.

    ``from_subgraph``: the model has no SignatureDefs; this one is subgraph 0's inputs and
    outputs named by their tensors.
    """

    key: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    method_name: str = PREDICT_METHOD
    from_subgraph: bool = False

    @property
    def batched(self) -> bool:
        """Every input has a leading dimension with the same signature (the batch)."""
        leading = {s.shape[0] if s.shape else None for s in self.inputs.values()}
        return bool(self.inputs) and None not in leading and len(leading) == 1

    @property
    def fixed_batch(self) -> int | None:
        """The batch size the model was converted with when it is static (None: any size)."""
        if not self.batched:
            return None
        first = next(iter(self.inputs.values())).shape[0]
        return None if first < 0 else int(first)

    def row_shape(self, spec: TensorSpec) -> tuple[int, ...]:
        """One example's shape: without the batch dimension when the signature is batched."""
        return spec.shape[1:] if self.batched else spec.shape

    def row_bytes(self) -> int:
        """Bytes of one example's inputs, free dimensions counted as 1."""
        total = 0
        for spec in self.inputs.values():
            dims = [max(d, 1) for d in self.row_shape(spec) or ()]
            total += int(np.prod(dims, dtype=np.int64)) * (8 if spec.is_string else spec.dtype.itemsize)
        return total

    def zeros(self, rows: int) -> dict | None:
        """Inputs of ``rows`` rows (zeros, empty strings), or None when a non-batch dimension is free."""
        feeds = {}
        for name, spec in self.inputs.items():
            if not spec.shape or any(d < 0 for d in spec.shape[1:]):
                return None
            shape = (rows,) + tuple(spec.shape[1:])
            feeds[name] = np.full(shape, b"", dtype=object) if spec.is_string else np.zeros(shape, spec.dtype)
        return feeds


class Runner:
    """Runs signatures for one thread: ``run(signature_key, {input: array}) -> {output: array}``.

    The outputs are the caller's (copies, never views of an interpreter's buffers).
    """

    def run(self, signature_key: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __call__(self, signature_key: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(signature_key, feeds)


@dataclass(eq=False)
class ServedModel:
    """An opened model: what it is, its signatures, and runners for threads.

    ``thread_safe``: one runner may be shared by every thread (a TensorFlow function).
    ``has_batch_function``: a SavedModel whose graph batches by itself (``BatchFunction``).
    ``signature_defs``: a SavedModel's SignatureDef protos, serialized, by key.
    ``make_interpreter``: a ``.tflite`` model's interpreter of its own (LiteRT's Python API),
    for work that reaches below signatures: a per-op profile, every intermediate tensor.
    """

    path: str | None
    kind: str  # "tflite" | "savedmodel"
    backend: str
    signatures: dict[str, Signature]
    _new_runner: Callable[[], Runner] = field(repr=False)
    make_interpreter: Callable | None = field(default=None, repr=False)
    thread_safe: bool = False
    has_batch_function: bool = False
    signature_defs: dict[str, bytes] | None = field(default=None, repr=False)

    def new_runner(self) -> Runner:
        """A runner for one thread (the shared one when ``thread_safe``)."""
        return self._new_runner()

    def signature(self, key: str | None = None) -> Signature:
        """Signature ``key``; without one, ``serving_default`` or else the model's only signature."""
        return pick_signature(self.signatures, key)


def pick_signature(signatures: dict[str, Signature], key: str | None = None) -> Signature:
    """``signatures[key]``; without a key, ``serving_default`` or else the only signature."""
    if key:
        if key in signatures:
            return signatures[key]
        raise SignatureNotFound(f"signature {key!r}: the model has no such signature (it has {sorted(signatures)})")
    if DEFAULT_SIGNATURE in signatures:
        return signatures[DEFAULT_SIGNATURE]
    if len(signatures) == 1:
        return next(iter(signatures.values()))
    raise SignatureNotFound(f"the model has {len(signatures)} signatures {sorted(signatures)} and none is "
                            f"{DEFAULT_SIGNATURE!r}; name the one to run")


# -- opening -------------------------------------------------------------------------------------

def find_model_file(path) -> tuple[str, Path]:
    """("savedmodel", dir) or ("tflite", file) for a model file or a directory holding one."""
    path = Path(path)
    if path.is_file():
        return "tflite", path
    if not path.is_dir():
        raise ModelError(f"{path}: no such file or directory")
    if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
        return "savedmodel", path
    files = sorted(p for p in path.glob("*.tflite") if p.is_file())
    if len(files) == 1:
        return "tflite", files[0]
    if (path / "model.tflite").is_file():
        return "tflite", path / "model.tflite"
    if not files:
        raise ModelError(f"{path}: holds neither a SavedModel (saved_model.pb) nor a .tflite file")
    raise ModelError(f"{path}: holds {len(files)} .tflite files and none is named model.tflite")


def open(model, backend: str | None = None, *, num_threads: int | None = None,  # noqa: A001 - kiln.runtime.open
         op_resolver_type=None, preserve_all_tensors: bool = False, batch_sizes=None) -> ServedModel:
    """Open ``model`` on ``backend`` and return its signatures and runners.

    Args:
      model: a ``.tflite`` file, its bytes, a SavedModel directory, or a directory holding
        one ``.tflite`` file (or several and a ``model.tflite``).
      backend: "kiln" (kiln's Interpreter with its default delegates), "litert"
        (ai-edge-litert), "xla" (kiln's Interpreter with `kiln.xla.XlaDelegate`) or "tf"
        (TensorFlow; SavedModels only). Default: "tf" for a SavedModel, else "kiln".
      num_threads: passed to the interpreters.
      op_resolver_type: an `OpResolverType` (kiln's or LiteRT's; e.g. BUILTIN_REF for the
        reference kernels alone).
      preserve_all_tensors: keep every intermediate readable (debugging).
      batch_sizes: the batch buckets the model will be fed (kiln serve's allowed_batch_sizes):
        the xla backend pads other batches up to them and compiles each when an interpreter loads
        (from ``MODEL.tflite.xla``'s saved programs, without tracing, when ``kiln xla-export``
        wrote one next to the model).
    """
    if backend is not None and backend not in BACKENDS:
        raise UnsupportedError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if isinstance(model, (bytes, bytearray, memoryview)):
        kind, path, content = "tflite", None, bytes(model)
    else:
        kind, path = find_model_file(model)
        content = None
    if kind == "savedmodel":
        if backend not in (None, "tf"):
            raise UnsupportedError(f"{path}: a SavedModel runs on backend 'tf' (TensorFlow), not {backend!r}; "
                                   "convert it with kiln.TFLiteConverter to run it on kiln, LiteRT or XLA")
        from .saved_model import open_saved_model

        return open_saved_model(path)
    backend = backend or "kiln"
    if backend == "tf":
        raise UnsupportedError(f"{path or 'the model'}: backend 'tf' runs SavedModels; a .tflite model needs "
                               "kiln, litert or xla")
    if content is None:
        try:
            content = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"{path}: cannot read: {exc}") from None
    return _open_tflite(content, None if path is None else os.fspath(path), backend, num_threads,
                        op_resolver_type, preserve_all_tensors, batch_sizes)


def _open_tflite(content: bytes, path, backend, num_threads, resolver_type, preserve, batch_sizes=None) -> ServedModel:
    from ..format import read_model

    ir = read_model(content, name=path)  # validated; kiln's interpreters share it (and its weights)
    make = _interpreter_factory(ir, content, backend, num_threads, resolver_type, preserve, batch_sizes, path)
    signatures = model_signatures(ir)
    has_defs = bool(ir.signatures)
    cache = SHAPE_CACHE if backend == "kiln" else 1
    try:
        probe = [make()]  # loads now, so a model the backend refuses fails here, not in a worker
    except KilnError:
        raise
    except (RuntimeError, ValueError) as exc:  # LiteRT's (and TensorFlow's) refusals
        raise ModelError(f"{path or 'the model'}: backend {backend!r} cannot load it: {exc}") from exc

    def first_or_new():
        try:
            return probe.pop()  # the probe serves the first runner
        except IndexError:
            return make()

    def new_runner() -> Runner:
        return _InterpreterRunner(first_or_new, signatures, has_defs, cache)

    return ServedModel(path, "tflite", backend, signatures, new_runner, first_or_new)


def _interpreter_factory(ir, content: bytes, backend: str, num_threads, resolver_type, preserve, batch_sizes=None,
                         path=None):
    if backend == "litert":
        try:
            from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType as LiteRTResolver
        except ImportError:
            raise UnsupportedError("backend 'litert' needs the ai-edge-litert package "
                                   "(pip install ai-edge-litert)") from None
        from .resolver import OpResolverType

        kind = getattr(LiteRTResolver, OpResolverType.of(resolver_type).name)
        return lambda: LiteRT(model_content=content, num_threads=num_threads, experimental_op_resolver_type=kind,
                              experimental_preserve_all_tensors=preserve)
    from .interpreter import Interpreter

    if backend in _DELEGATE_BACKENDS:
        delegates = _DELEGATE_BACKENDS[backend](batch_sizes, path)
        return lambda: Interpreter(model_content=ir, num_threads=num_threads,
                                   experimental_op_resolver_type=resolver_type,
                                   experimental_preserve_all_tensors=preserve, experimental_delegates=delegates())
    if backend != "kiln":
        raise UnsupportedError(f"backend {backend!r} is not available here (nothing registered it)")
    return lambda: Interpreter(model_content=ir, num_threads=num_threads, experimental_op_resolver_type=resolver_type,
                               experimental_preserve_all_tensors=preserve)


# -- specs from the model ------------------------------------------------------------------------

def _spec(name: str, tensor, index_range) -> TensorSpec:
    dtype = np.dtype(object) if tensor.dtype == DType.STRING else np.dtype(tensor.dtype.numpy)
    return TensorSpec(name, dtype, tuple(int(d) for d in tensor.signature), tensor.name, index_range)


def model_signatures(ir) -> dict[str, Signature]:
    """The signatures of a kiln IR model (subgraph 0 by tensor names when it has none)."""
    out = {}
    for sig in ir.signatures:
        out[sig.key] = Signature(sig.key, {n: _spec(n, t, index_range(t)) for n, t in sig.inputs.items()},
                                 {n: _spec(n, t, None) for n, t in sig.outputs.items()})
    if not out:
        sg = ir.subgraphs[0]
        out[DEFAULT_SIGNATURE] = Signature(DEFAULT_SIGNATURE, {t.name: _spec(t.name, t, index_range(t)) for t in sg.inputs},
                                           {t.name: _spec(t.name, t, None) for t in sg.outputs}, from_subgraph=True)
    return out


def index_range(tensor) -> tuple[int, int] | None:
    """``[low, high)`` for an integer input whose values index a table (GATHER indices,
    EMBEDDING_LOOKUP ids), directly or through reshapes and casts; None when nothing bounds it."""
    if tensor.dtype not in (DType.INT32, DType.INT64, DType.INT16, DType.INT8, DType.UINT8):
        return None
    low, high = None, None
    seen, pending = set(), [tensor]
    while pending:
        t = pending.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        for op, position in t.users:
            size = None
            if op.op_type == "GATHER" and position == 1 and op.inputs[0] is not None:
                shape = op.inputs[0].signature
                axis = int(op.options.get("axis", 0) or 0)
                axis = axis + len(shape) if axis < 0 else axis
                size = shape[axis] if 0 <= axis < len(shape) else None
            elif op.op_type == "EMBEDDING_LOOKUP" and position == 0 and op.inputs[1] is not None:
                shape = op.inputs[1].signature
                size = shape[0] if shape else None
            elif _passes_values(op) and position == 0 and op.outputs and op.outputs[0] is not None:
                pending.append(op.outputs[0])
            if size is not None and size >= 0:
                low, high = 0, size if high is None else min(high, size)
    return None if high is None else (low, high)


# -- runners -------------------------------------------------------------------------------------

class _InterpreterRunner(Runner):
    """One thread's interpreters: up to ``cache`` of them, one per input-shape set (least
    recently used out); with ``cache`` 1, one interpreter resized as shapes change."""

    def __init__(self, make, signatures: dict[str, Signature], has_defs: bool, cache: int):
        self._make = make
        self._signatures = signatures
        self._has_defs = has_defs
        self._cache = cache
        self._by_shapes: dict = {}
        self._interpreter = None

    def _call(self, key: str, feeds):
        if self._cache == 1:
            if self._interpreter is None:
                self._interpreter = _Calls(self._make(), self._has_defs)
            return self._interpreter
        shapes = (key,) + tuple((n, np.shape(a)) for n, a in feeds.items())
        calls = self._by_shapes.pop(shapes, None)
        if calls is None:
            if len(self._by_shapes) >= self._cache:
                self._by_shapes.pop(next(iter(self._by_shapes)))  # the least recently used
            calls = _Calls(self._make(), self._has_defs)
        self._by_shapes[shapes] = calls
        return calls

    def run(self, signature_key: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        signature = self._signatures.get(signature_key)
        if signature is None:
            raise SignatureNotFound(f"signature {signature_key!r}: the model has {sorted(self._signatures)}")
        missing = [n for n in signature.inputs if n not in feeds]
        unknown = [n for n in feeds if n not in signature.inputs]
        if missing or unknown:
            raise InterpreterError(f"signature {signature_key!r} takes inputs {list(signature.inputs)}; "
                                   f"missing {missing}, unknown {unknown}")
        return self._call(signature_key, feeds).run(signature, feeds)


class _Calls:
    """One interpreter with its signature runners (or subgraph 0 by tensor names)."""

    def __init__(self, interpreter, has_defs: bool):
        self.interpreter = interpreter
        self._has_defs = has_defs
        self._runners: dict = {}
        if not has_defs:
            interpreter.allocate_tensors()
            self._inputs = {d["name"]: d for d in interpreter.get_input_details()}
            self._outputs = {d["name"]: d["index"] for d in interpreter.get_output_details()}

    def run(self, signature: Signature, feeds) -> dict[str, np.ndarray]:
        if self._has_defs:
            runner = self._runners.get(signature.key)
            if runner is None:
                runner = self._runners[signature.key] = self.interpreter.get_signature_runner(signature.key)
            return {n: np.array(v) for n, v in runner(**feeds).items()}
        interp, resized = self.interpreter, False
        for name, value in feeds.items():
            detail = self._inputs[name]
            if tuple(detail["shape"]) != np.shape(value):
                interp.resize_tensor_input(detail["index"], np.shape(value))
                resized = True
        if resized:
            interp.allocate_tensors()
            self._inputs = {d["name"]: d for d in interp.get_input_details()}
        for name, value in feeds.items():
            interp.set_tensor(self._inputs[name]["index"], value)
        interp.invoke()
        return {n: np.array(interp.get_tensor(i)) for n, i in self._outputs.items()}


__all__ = ["BACKENDS", "DEFAULT_SIGNATURE", "Runner", "ServedModel", "Signature", "SignatureNotFound",
           "TensorSpec", "find_model_file", "index_range", "model_signatures", "open", "pick_signature",
           "register_backend"]
