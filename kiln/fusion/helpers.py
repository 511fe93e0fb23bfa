"""Building blocks for fusions: emit IR around a composite call, fold weight transforms.

A fusion turns a composite call into LiteRT ops. Most of the work is deriving the fused op's
operands from the function's arguments — transposing a kernel, slicing it into gates,
splitting a bias. `FusionBuilder` does those transforms on constants at conversion time
(the result is a new constant, no op is emitted) and emits the equivalent op when an
argument is a run-time value, so a fusion is written once for both cases.

Gate helpers (`gate_blocks`, `split_gates`) name gates with one letter each, LiteRT's LSTM
vocabulary: ``i`` input gate, ``f`` forget gate, ``c`` cell candidate, ``o`` output gate.
A layout string such as ``"ifco"`` (Keras) or ``"cifo"`` (lingvo) says in which order a
framework stacks them.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence, Union

import numpy as np

from ..errors import KilnError
from ..ir import Operator, Subgraph, Tensor
from ..schema import DType
from .registry import CompositeCall, note_fused
from .registry import not_fused as reject  # "<name>: not fused: <reason>", to raise

#: What a fusion may pass where an operand is expected: an IR tensor or a NumPy constant.
Operand = Union[Tensor, np.ndarray]


def implements(name: str, **attrs) -> str:
    """The ``experimental_implements`` string for a composite ``name`` with ``attrs``.

    Without attrs it is the bare name; with attrs a NameAttrList in protobuf text format,
    which TensorFlow stores on the function and the importer hands to the fusion as
    ``CompositeCall.attrs``. Values: bool, int, float or str.
    """
    if not attrs:
        return name
    parts = [f"name: {_quote(name)}"]
    for key, value in attrs.items():
        if isinstance(value, bool):
            field = f"b: {'true' if value else 'false'}"
        elif isinstance(value, int):
            field = f"i: {value}"
        elif isinstance(value, float):
            field = f"f: {value!r}"
        elif isinstance(value, str):
            field = f"s: {_quote(value)}"
        else:
            raise KilnError(f"implements attr {key!r}: {type(value).__name__} is not bool, int, "
                            "float or str")
        parts.append(f"attr {{ key: {_quote(key)} value {{ {field} }} }}")
    return " ".join(parts)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- pure NumPy helpers (weights known at conversion time) ---------------------------------------

def gate_blocks(weights: np.ndarray, layout: str, axis: int = -1) -> dict[str, np.ndarray]:
    """Split ``weights`` into equal blocks along ``axis``, one per gate letter of ``layout``.

    ``gate_blocks(kernel, "ifco", axis=1)`` cuts a Keras kernel [input, 4*units] into four
    [input, units] blocks keyed "i", "f", "c", "o".
    """
    arr = np.asarray(weights)
    n = len(layout)
    if arr.shape[axis] % n:
        raise KilnError(f"cannot split axis {axis} of size {arr.shape[axis]} into {n} gates "
                        f"({layout!r})")
    return dict(zip(layout, np.split(arr, n, axis=axis)))


def shape_of(t: Operand) -> tuple[int, ...]:
    """Static shape with -1 for dynamic dims (a Tensor's signature, an array's shape)."""
    return tuple(t.signature) if isinstance(t, Tensor) else tuple(np.shape(t))


def value_of(t: Operand) -> np.ndarray | None:
    """The constant value of an operand, None when it is only known at run time."""
    if isinstance(t, Tensor):
        return t.data if t.is_constant else None
    return np.asarray(t)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting over signatures where -1 is an unknown size."""
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif x == -1 or y == -1:
            out.append(max(x, y))
        else:
            raise KilnError(f"shapes {a} and {b} do not broadcast")
    return tuple(out)


# -- the builder ---------------------------------------------------------------------------

class FusionBuilder:
    """Adds tensors and operators for one composite call, named ``<prefix>/<what>``.

    Transform methods (`transpose`, `slice`, `split`, `reverse`, `reshape`, `add`, `mul`,
    `concat`, `step`) fold when every input is constant — the result is then a NumPy array,
    which becomes a constant tensor only where an emitted op consumes it, so intermediate
    results (a transposed kernel before it is cut into gates) never reach the model — and
    emit one op otherwise.
    """

    def __init__(self, target: CompositeCall | Subgraph, prefix: str | None = None):
        if isinstance(target, CompositeCall):
            self.call: CompositeCall | None = target
            self.subgraph = target.subgraph
            prefix = prefix or target.label or str(target.attrs.get("layer") or target.name)
        else:
            self.call = None
            self.subgraph = target
        self.prefix = prefix or "fused"
        self.operators: list[Operator] = []
        #: Values a fusion derives once per call and reuses (e.g. batch-sized zeros).
        self.cache: dict = {}

    # -- naming and raw construction -------------------------------------------------------
    def name(self, what: str) -> str:
        """``<prefix>/<what>``, numbered ``_1``, ``_2``... when the subgraph already has it."""
        return self.subgraph.unique_name(f"{self.prefix}/{what}", "_")

    def const(self, value, what: str = "const", dtype: DType | None = None) -> Tensor:
        """A constant tensor (the folded result of a weight transform, a shape, a scalar)."""
        arr = np.asarray(value)
        dt = DType.from_numpy(arr.dtype) if dtype is None else DType(dtype)
        arr = np.array(arr, dtype=dt.numpy, order="C")  # keeps 0-d scalars 0-d
        return self.subgraph.add_tensor(self.name(what), dt, arr.shape, data=arr)

    def tensor(self, what: str, dtype: DType, signature: Iterable[int], **kwargs) -> Tensor:
        """A new run-time tensor; -1 in ``signature`` marks a dynamic dim (stored as 1)."""
        sig = tuple(int(d) for d in signature)
        shape = tuple(1 if d < 0 else d for d in sig)
        return self.subgraph.add_tensor(self.name(what), dtype, shape,
                                        shape_signature=sig if sig != shape else None, **kwargs)

    def operand(self, t: Operand, what: str = "const") -> Tensor:
        """An IR tensor for ``t``: tensors pass through, arrays become constants."""
        return t if isinstance(t, Tensor) else self.const(np.asarray(t), what)

    def emit(self, op_type: str, inputs: Sequence[Operand | None], outputs: Sequence[Tensor],
             options: Mapping | None = None, **kwargs) -> Operator:
        """Append one operator (array inputs become constants); its version is the lowest its
        features need (the op record's rule, when kiln knows the op)."""
        inputs = [None if t is None else self.operand(t) for t in inputs]
        op = self.subgraph.add_operator(op_type, inputs, outputs, options=dict(options or {}),
                                        **kwargs)
        op.version = _version(op)
        self.operators.append(op)
        return op

    # -- transforms (folded on constants) ---------------------------------------------------
    def _fold_or_emit(self, what, values, fold, op_type, inputs, out_sig, dtype, options=None):
        if all(v is not None for v in values):
            return np.array(fold(*values), order="C")
        out = self.tensor(what, dtype, out_sig)
        self.emit(op_type, inputs, [out], options)
        return out

    def transpose(self, t: Operand, perm: Sequence[int] | None = None, what: str = "transposed"):
        sig = shape_of(t)
        perm = tuple(range(len(sig)))[::-1] if perm is None else tuple(perm)
        return self._fold_or_emit(
            what, [value_of(t)], lambda v: np.transpose(v, perm), "TRANSPOSE",
            [t, np.asarray(perm, np.int32)], [sig[p] for p in perm], _dtype(t))

    def slice(self, t: Operand, begin: Sequence[int], size: Sequence[int], what: str = "slice"):
        """``t[begin : begin + size]`` per axis (size -1: to the end)."""
        sig = shape_of(t)
        out_sig = [(d - b if d >= 0 else -1) if s < 0 else s for d, b, s in zip(sig, begin, size)]

        def fold(v):
            idx = tuple(slice(b, None if s < 0 else b + s) for b, s in zip(begin, size))
            return v[idx]

        return self._fold_or_emit(
            what, [value_of(t)], fold, "SLICE",
            [t, np.asarray(begin, np.int32), np.asarray(size, np.int32)], out_sig, _dtype(t))

    def split(self, t: Operand, parts: int, axis: int = 0, what: str = "part") -> list:
        """Equal parts along ``axis`` (which must have a static size)."""
        sig = shape_of(t)
        axis %= len(sig)
        if sig[axis] < 0 or sig[axis] % parts:
            raise KilnError(f"cannot split axis {axis} of shape {list(sig)} into {parts} parts")
        step = sig[axis] // parts
        out = []
        for k in range(parts):
            begin = [0] * len(sig)
            size = [-1] * len(sig)
            begin[axis], size[axis] = k * step, step
            out.append(self.slice(t, begin, size, what=f"{what}{k}"))
        return out

    def reverse(self, t: Operand, axis: int, what: str = "reversed"):
        return self._fold_or_emit(
            what, [value_of(t)], lambda v: np.flip(v, axis), "REVERSE_V2",
            [t, np.asarray([axis], np.int32)], shape_of(t), _dtype(t))

    def reshape(self, t: Operand, signature: Sequence[int], what: str = "reshaped"):
        """Reshape to ``signature`` (at most one -1, inferred at run time as TensorFlow does)."""
        sig = tuple(int(d) for d in signature)
        known = shape_of(t)
        out_sig = sig
        if sig.count(-1) == 1 and all(d >= 0 for d in known):  # static input: infer the -1
            rest = int(np.prod([d for d in sig if d >= 0]))
            out_sig = tuple(int(np.prod(known)) // max(rest, 1) if d < 0 else d for d in sig)
        return self._fold_or_emit(
            what, [value_of(t)], lambda v: np.reshape(v, sig), "RESHAPE",
            [t, np.asarray(sig, np.int32)], out_sig, _dtype(t))

    def add(self, a: Operand, b: Operand, what: str = "sum"):
        return self._fold_or_emit(
            what, [value_of(a), value_of(b)], np.add, "ADD", [a, b],
            _broadcast(shape_of(a), shape_of(b)), _dtype(a))

    def mul(self, a: Operand, b: Operand, what: str = "product"):
        return self._fold_or_emit(
            what, [value_of(a), value_of(b)], np.multiply, "MUL", [a, b],
            _broadcast(shape_of(a), shape_of(b)), _dtype(a))

    def concat(self, parts: Sequence[Operand], axis: int, what: str = "concat"):
        sigs = [shape_of(p) for p in parts]
        axis %= len(sigs[0])
        out_sig = list(sigs[0])
        dims = [s[axis] for s in sigs]
        out_sig[axis] = -1 if any(d < 0 for d in dims) else sum(dims)
        return self._fold_or_emit(
            what, [value_of(p) for p in parts], lambda *v: np.concatenate(v, axis),
            "CONCATENATION", list(parts), out_sig, _dtype(parts[0]), {"axis": axis})

    def step(self, seq: Operand, index: int, axis: int, what: str = "step"):
        """One position along ``axis`` with that axis removed (a STRIDED_SLICE, as TensorFlow
        emits for an RNN's last output)."""
        sig = shape_of(seq)
        rank = len(sig)
        axis %= rank
        begin = [0] * rank
        end = [0] * rank
        begin[axis] = index
        end[axis] = index + 1 if index != -1 else 0
        full = ((1 << rank) - 1) & ~(1 << axis)  # every other axis: whole range
        out_sig = [d for k, d in enumerate(sig) if k != axis]
        options = {"begin_mask": full, "end_mask": full, "shrink_axis_mask": 1 << axis}

        def fold(v):
            return np.take(v, index, axis=axis)

        return self._fold_or_emit(
            what, [value_of(seq)], fold, "STRIDED_SLICE",
            [seq, np.asarray(begin, np.int32), np.asarray(end, np.int32),
             np.ones(rank, np.int32)], out_sig, _dtype(seq), options)

    def split_gates(self, t: Operand, layout: str, axis: int = 0,
                    what: str = "gate") -> dict[str, Tensor]:
        """`split` keyed by gate letters: ``split_gates(w_t, "ifco")`` -> {"i": ..., ...}."""
        parts = self.split(t, len(layout), axis, what=what)
        return dict(zip(layout, parts))


def as_dtype(dtype) -> DType:
    """A DType from what an importer may put in ``CompositeCall.output_dtypes``: a DType, its
    number, a NumPy dtype or a TensorFlow DType (anything with ``as_numpy_dtype``)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, int):
        return DType(dtype)
    return DType.from_numpy(getattr(dtype, "as_numpy_dtype", dtype))


def _dtype(t: Operand) -> DType:
    return t.dtype if isinstance(t, Tensor) else DType.from_numpy(np.asarray(t).dtype)


def _version(op: Operator) -> int:
    """The op's version by its record's rule (1 when kiln has no record for it)."""
    from .. import ops  # local import: the op families are heavy and fusions rarely need them

    record = ops.get(op.op_type)
    return record.version(op) if record is not None else 1


__all__ = [
    "FusionBuilder", "Operand", "as_dtype", "gate_blocks", "implements", "note_fused", "reject",
    "shape_of", "value_of",
]
