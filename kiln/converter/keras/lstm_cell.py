"""The cell of a Keras 3 LSTM loop: ``h = sigmoid(o) * act(c)``, ``c = sigmoid(f) * c_prev +
sigmoid(i) * act(g)``, with each gate's pre-activation evaluated symbolically as
``x_t·W + h_prev·R + b`` over the body's ops and read-only weights — which gives the fused op's
per-gate weight blocks whatever way Keras (implementation 1 or 2, bias or not) computed them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...fusion.helpers import value_of
from ...fusion.lstm import LstmWeights
from ...ir import Tensor
from ...schema import Activation
from ..tfutil import shape_signature
from ..values import ResourceRef
from .common import UNI_OP, Mismatch, const_value, placeholder_index, same, strip

#: TensorFlow op of the cell activation -> the fused op's activation.
CELL_ACTIVATIONS = {"Tanh": Activation.TANH, "Relu": Activation.RELU, "Relu6": Activation.RELU6}


# -- the cell --------------------------------------------------------------------------------


def _operands(t, types) -> tuple | None:
    t = strip(t)
    if t.op.type not in types:
        return None
    return strip(t.op.inputs[0]), strip(t.op.inputs[1])


def _gate(t, what: str):
    """The pre-activation of a sigmoid gate."""
    t = strip(t)
    if t.op.type != "Sigmoid":
        raise Mismatch(f"the {what} gate is computed by {t.op.type}, not Sigmoid "
                       f"(recurrent_activation is not sigmoid; {UNI_OP}'s gates always are)")
    return t.op.inputs[0]


def _activation_of(t):
    """(op type, its input) when ``t`` is a cell activation (or Sigmoid), else (None, t)."""
    t = strip(t)
    if t.op.type in CELL_ACTIVATIONS or t.op.type == "Sigmoid":
        return t.op.type, strip(t.op.inputs[0])
    return None, t


def _sigmoid_cell() -> Mismatch:
    return Mismatch(f"the cell goes through Sigmoid (activation='sigmoid'); {UNI_OP}'s cell "
                    "activation is tanh, relu or relu6")


def match_cell(h_new, c_new, c_prev):
    """(activation, {gate: pre-activation tensor}) of ``h = o * act(c)``,
    ``c = f * c_prev + i * act(g)``."""
    pair = _operands(h_new, ("Mul",))
    if pair is None:
        raise Mismatch(f"the new h is {h_new.op.type}, not sigmoid(o) * act(c): not an LSTM cell")
    act, gate_o = None, None
    for p, q in (pair, pair[::-1]):
        if same(q, c_new):
            raise Mismatch("the cell state is not passed through an activation "
                           f"(activation='linear'); {UNI_OP}'s NONE does not compute a linear cell")
        kind, inner = _activation_of(q)
        if kind is not None and same(inner, c_new):
            if kind == "Sigmoid":
                raise _sigmoid_cell()
            act, gate_o = kind, p
            break
    if act is None:
        raise Mismatch("the new h is not sigmoid(o) * act(c) of the new cell state: not an LSTM cell")
    terms = _operands(c_new, ("AddV2", "Add"))
    if terms is None:
        raise Mismatch(f"the new cell state is {c_new.op.type}, not f * c + i * g: not an LSTM cell")
    gates = {"o": _gate(gate_o, "output")}
    for m_f, m_i in (terms, terms[::-1]):
        forget = _operands(m_f, ("Mul",))
        if forget is None or not any(same(x, c_prev) for x in forget):
            continue
        gates["f"] = _gate(forget[1] if same(forget[0], c_prev) else forget[0], "forget")
        update = _operands(m_i, ("Mul",))
        for p, q in (update, update[::-1]) if update else ():
            kind, inner = _activation_of(q)
            if kind is None or strip(p).op.type != "Sigmoid":
                continue
            if kind == "Sigmoid":
                raise _sigmoid_cell()
            if kind != act:
                raise Mismatch(f"the cell candidate uses {kind} and the cell output {act}; "
                               f"{UNI_OP} has one activation for both")
            gates["i"], gates["c"] = _gate(p, "input"), inner
            break
        break
    if set(gates) != set("ifco"):
        raise Mismatch("the new cell state is not sigmoid(f) * c + sigmoid(i) * act(g): not an "
                       "LSTM cell")
    return CELL_ACTIVATIONS[act], gates


# -- gate pre-activations as x·W + h·R + b -----------------------------------------------------


@dataclass
class _Affine:
    """``sum(source · terms[source]) + bias`` over the row vectors x_t and h_prev."""

    terms: dict[str, np.ndarray]
    bias: np.ndarray

    @property
    def width(self) -> int:
        return self.bias.shape[0]

    def map(self, fn) -> "_Affine":
        return _Affine({k: fn(w) for k, w in self.terms.items()}, fn(self.bias[None, :])[0])

    def plus(self, other: "_Affine", sign: float = 1.0) -> "_Affine":
        if other.width != self.width:
            raise Mismatch("gate terms of different widths are added")
        terms = dict(self.terms)
        for k, w in other.terms.items():
            terms[k] = terms[k] + sign * w if k in terms else sign * w
        return _Affine(terms, self.bias + sign * other.bias)


@dataclass
class _Evaluator:
    """Evaluates body tensors as constants (NumPy) or `_Affine` forms."""

    ctx: Any
    body: Any
    x_t: Any
    h_prev: Any
    c_prev: Any
    passthrough: set
    n_in: int
    units: int
    memo: dict = field(default_factory=dict)

    def __call__(self, t):
        key = t.name
        if key not in self.memo:
            self.memo[key] = self._eval(t)
        return self.memo[key]

    def _eval(self, t):
        if same(t, self.x_t):
            return _Affine({"x": np.eye(self.n_in, dtype=np.float64)}, np.zeros(self.n_in))
        if same(t, self.h_prev):
            return _Affine({"h": np.eye(self.units, dtype=np.float64)}, np.zeros(self.units))
        if same(t, self.c_prev):
            raise Mismatch("a gate reads the previous cell state (peephole connections); "
                           "Keras' LSTM has none")
        op = t.op
        kind = op.type
        if kind in ("Identity", "IdentityN", "StopGradient", "Snapshot"):
            return self(op.inputs[t.value_index if kind == "IdentityN" else 0])
        if kind == "Const":
            value = const_value(t)
            return value.astype(np.float64) if value.dtype.kind == "f" else value
        if kind == "Placeholder":
            return self._argument(t)
        if kind == "ReadVariableOp":
            return self._variable(op.inputs[0])
        if kind == "Cast":
            value = self(op.inputs[0])
            if op.get_attr("DstT").name not in ("float32", "float64") and isinstance(value, _Affine):
                raise Mismatch(f"a gate term is cast to {op.get_attr('DstT').name}")
            return value
        handler = _OPS.get(kind)
        if handler is None:
            raise Mismatch(f"a gate pre-activation uses {kind} ({op.name!r}); the fused op "
                           "computes x·W + h·R + b")
        return handler(self, op, t)

    def _argument(self, t):
        k = placeholder_index(self.body, t)
        if k is None or k not in self.passthrough:
            raise Mismatch(f"a gate reads loop variable {k}, which changes from step to step")
        v = self.ctx.value(k)
        arr = value_of(v) if isinstance(v, Tensor) else None
        if arr is None:
            raise Mismatch(f"a gate reads loop variable {k}, which is not a constant")
        return np.asarray(arr, np.float64) if arr.dtype.kind == "f" else arr

    def _variable(self, handle):
        k = placeholder_index(self.body, handle)
        v = self.ctx.value(k) if k is not None and k in self.passthrough else None
        if not isinstance(v, ResourceRef):
            raise Mismatch("a weight is not a variable the loop gets from outside")
        if v.var.mutable:
            raise Mismatch(f"weight {v.var.name!r} is a variable the model assigns")
        arr = np.asarray(v.var.value())
        return arr.astype(np.float64) if arr.dtype.kind == "f" else arr


def _consts(ev: _Evaluator, op, tensors) -> list:
    values = [ev(t) for t in tensors]
    if any(isinstance(v, _Affine) for v in values):
        raise Mismatch(f"{op.type} {op.name!r} slices a gate term, not a weight")
    return [np.asarray(v) for v in values]


def _matmul(ev: _Evaluator, op, t):
    if op.type == "MatMul":
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    else:
        ta, tb = op.get_attr("adj_x"), op.get_attr("adj_y")
    a, b = ev(op.inputs[0]), ev(op.inputs[1])
    if isinstance(b, _Affine) or (isinstance(a, _Affine) and ta):
        raise Mismatch(f"{op.type} {op.name!r} does not multiply a step's row by a weight")
    b = np.asarray(b)
    if b.ndim != 2:
        raise Mismatch(f"{op.type} {op.name!r} multiplies by a {b.ndim}-D weight")
    b = b.T if tb else b
    if isinstance(a, _Affine):
        if b.shape[0] != a.width:
            raise Mismatch(f"{op.type} {op.name!r}: weight of shape {list(b.shape)} for width {a.width}")
        return _Affine({k: w @ b for k, w in a.terms.items()}, a.bias @ b)
    a = np.asarray(a)
    return (a.T if ta else a) @ b


def _vector(ev: _Evaluator, value, width: int, what: str) -> np.ndarray:
    v = np.asarray(value, np.float64)
    if v.ndim == 0:
        return np.full(width, float(v))
    if v.shape in ((width,), (1, width)):
        return v.reshape(width)
    raise Mismatch(f"{what} adds a term of shape {list(v.shape)} to gates of width {width}")


def _add(ev: _Evaluator, op, t):
    a, b = ev(op.inputs[0]), ev(op.inputs[1])
    sign = -1.0 if op.type == "Sub" else 1.0
    if isinstance(a, _Affine) and isinstance(b, _Affine):
        return a.plus(b, sign)
    if isinstance(a, _Affine):
        return _Affine(dict(a.terms), a.bias + sign * _vector(ev, b, a.width, op.name))
    if isinstance(b, _Affine):
        neg = b if sign > 0 else b.map(lambda w: -w)
        return _Affine(dict(neg.terms), neg.bias + _vector(ev, a, b.width, op.name))
    return a + sign * b


def _mul(ev: _Evaluator, op, t):
    a, b = ev(op.inputs[0]), ev(op.inputs[1])
    if isinstance(a, _Affine) and isinstance(b, _Affine):
        raise Mismatch(f"Mul {op.name!r} multiplies two gate terms")
    if isinstance(b, _Affine):
        a, b = b, a
    if isinstance(a, _Affine):
        v = _vector(ev, b, a.width, op.name)
        return a.map(lambda w: w * v)
    return a * b


def _split(ev: _Evaluator, op, t):
    if op.type == "Split":
        axis, value = _consts(ev, op, [op.inputs[0]])[0], ev(op.inputs[1])
        n = op.get_attr("num_split")
        sizes = None
    else:  # SplitV
        value = ev(op.inputs[0])
        sizes, axis = _consts(ev, op, op.inputs[1:3])
        n = len(sizes)
    axis = int(axis)
    k = t.value_index
    if isinstance(value, _Affine):
        if axis not in (1, -1):
            raise Mismatch(f"{op.type} {op.name!r} splits the gates along axis {axis}")
        width = value.width
        bounds = _split_bounds(width, n, sizes)
        lo, hi = bounds[k], bounds[k + 1]
        return _Affine({s: w[:, lo:hi] for s, w in value.terms.items()}, value.bias[lo:hi])
    value = np.asarray(value)
    axis %= value.ndim
    bounds = _split_bounds(value.shape[axis], n, sizes)
    return np.take(value, np.arange(bounds[k], bounds[k + 1]), axis=axis)


def _split_bounds(width: int, n: int, sizes) -> list[int]:
    if sizes is None:
        if width % n:
            raise Mismatch(f"cannot split width {width} into {n} parts")
        sizes = [width // n] * n
    sizes = [int(s) for s in sizes]
    if -1 in sizes:
        sizes[sizes.index(-1)] = width - (sum(sizes) + 1)
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])]


def _strided_slice(ev: _Evaluator, op, t):
    value, begin, end, strides = _consts(ev, op, op.inputs[:4])
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        raise Mismatch(f"StridedSlice {op.name!r} uses ellipsis / new axes")
    bm, em, sm = (op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
    index = []
    for d in range(value.ndim):
        if d >= len(begin):
            index.append(slice(None))
            continue
        if sm >> d & 1:
            index.append(int(begin[d]))
            continue
        b = None if bm >> d & 1 else int(begin[d])
        e = None if em >> d & 1 else int(end[d])
        index.append(slice(b, e, int(strides[d])))
    return value[tuple(index)]


def _reshape_like(ev: _Evaluator, op, t):
    values = _consts(ev, op, op.inputs[:2])
    if op.type == "Transpose":
        return np.transpose(values[0], values[1])
    return np.reshape(values[0], values[1])


def _concat(ev: _Evaluator, op, t):
    axis = int(_consts(ev, op, op.inputs[-1:])[0])
    values = [ev(x) for x in op.inputs[:-1]]
    if not any(isinstance(v, _Affine) for v in values):
        return np.concatenate([np.asarray(v) for v in values], axis=axis)
    if axis not in (1, -1) or not all(isinstance(v, _Affine) for v in values):
        raise Mismatch(f"ConcatV2 {op.name!r} joins a step's row with a weight")
    # [x, h] side by side (a TF1-style cell multiplies the concatenation by one kernel).
    sources = {k: w.shape[0] for v in values for k, w in v.terms.items()}
    terms = {k: np.concatenate([v.terms.get(k, np.zeros((n, v.width))) for v in values], axis=1)
             for k, n in sources.items()}
    return _Affine(terms, np.concatenate([v.bias for v in values]))


_OPS = {
    "MatMul": _matmul, "BatchMatMulV2": _matmul, "BatchMatMulV3": _matmul,
    "AddV2": _add, "Add": _add, "BiasAdd": _add, "Sub": _add, "Mul": _mul,
    "Split": _split, "SplitV": _split, "StridedSlice": _strided_slice,
    "Transpose": _reshape_like, "Reshape": _reshape_like, "ConcatV2": _concat,
}


def cell_weights(ctx, body, x_t, h_prev, c_prev, gates, passthrough) -> LstmWeights:
    n_in = (shape_signature(x_t.shape) or (-1,))[-1]
    if n_in < 0:
        n_in = ctx.value(placeholder_index(body, x_t.op.inputs[0])).tensor.signature[-1]
    units = (shape_signature(h_prev.shape) or (-1,))[-1]
    if n_in < 0 or units < 0:
        raise Mismatch("the step's input or state has an unknown width")
    ev = _Evaluator(ctx, body, x_t, h_prev, c_prev, passthrough, n_in, units)
    blocks: dict[str, dict[str, np.ndarray]] = {"input": {}, "recurrent": {}, "bias": {}}
    for g, z in gates.items():
        form = ev(z)
        if not isinstance(form, _Affine):
            raise Mismatch(f"the {g} gate does not depend on the step's input")
        if form.width != units or set(form.terms) - {"x", "h"}:
            raise Mismatch(f"the {g} gate has width {form.width}, the state {units}")
        wx = form.terms.get("x", np.zeros((n_in, units)))
        wh = form.terms.get("h", np.zeros((units, units)))
        blocks["input"][g] = np.ascontiguousarray(wx.T, np.float32)
        blocks["recurrent"][g] = np.ascontiguousarray(wh.T, np.float32)
        blocks["bias"][g] = np.ascontiguousarray(form.bias, np.float32)
    return LstmWeights(**blocks)
