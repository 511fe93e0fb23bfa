"""Recognise the Keras 3 LSTM while loop in a TensorFlow graph and fuse it.

Keras 3 leaves no annotation on an LSTM: a SavedModel exported without kiln's hook
(``model.export(dir)``, ``tf.saved_model.save``) holds the layer as the generic ``rnn()``
loop — a While over TensorLists whose body is the cell's plain math. The importer's While
emitter asks `fuse_lstm_loop` first; it answers with the While's outputs computed by one
UNIDIRECTIONAL_SEQUENCE_LSTM (or None for loops that do not read a sequence, or NotFusable
with the reason for loops that do but are not an LSTM it can fuse).

What is checked, on the TensorFlow graph (structure, not names):

* the loop: counters that start at 0 and add 1; the condition is ``counter < bound`` terms
  whose bounds are the sequence length (a constant equal to it, or ``shape(seq)[0]``); one
  TensorListGetItem reads the input list (TensorListFromTensor) at the step; one
  TensorListSetItem writes the new h at the step (``return_sequences``) or at 0 (last only);
  two more carried values, h and c; everything else passes through unchanged;
* the cell: ``h = sigmoid(z_o) * act(c)``, ``c = sigmoid(z_f) * c_prev + sigmoid(z_i) *
  act(z_c)`` with act tanh / relu / relu6, where each ``z`` is evaluated symbolically as
  ``x_t·W + h_prev·R + b`` over MatMul / Add / BiasAdd / Split / slices of read-only weights
  — so Keras' implementation 1 and 2, with and without bias, all reduce to per-gate blocks.

go_backwards needs nothing special: Keras reverses the sequence before the loop, and the
fused op reads the same reversed sequence. Two fused loops over the same input, one
reversed, are merged into ONE BIDIRECTIONAL_SEQUENCE_LSTM (Keras' Bidirectional).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import KilnError
from ...fusion.helpers import FusionBuilder, note_fused, reject, value_of
from ...fusion.lstm import LstmOptions, LstmResult, LstmWeights, emit_bidirectional_lstm, emit_lstm
from ...fusion.registry import CompositeCall, guarded
from ...ir import Operator, Tensor
from ...schema import Activation, DType
from ..tfutil import function_graph, shape_signature, tf
from ..values import ResourceRef, TensorListValue

UNI_OP = "UNIDIRECTIONAL_SEQUENCE_LSTM"
BIDI_OP = "BIDIRECTIONAL_SEQUENCE_LSTM"
#: TensorFlow op of the cell activation -> the fused op's activation.
CELL_ACTIVATIONS = {"Tanh": Activation.TANH, "Relu": Activation.RELU, "Relu6": Activation.RELU6}
_CACHE_KEY = "kiln.converter.keras.lstm_loop"


class _Mismatch(Exception):
    """The loop is not what this module fuses; the message says why."""


@dataclass
class LoopFusion:
    """What `fuse_lstm_loop` hands back: one value per While output, report lines."""

    values: list
    notes: list[str]


# -- the entry point ---------------------------------------------------------------------------

def fuse_lstm_loop(ctx) -> LoopFusion | None:
    """Fuse the While op of ``ctx`` (an importer `EmitContext`) when it is a Keras LSTM loop.

    Returns None when the loop reads no sequence (not an RNN loop: nothing to report).
    Raises NotFusable ("<layer>: not fused: <reason>") for sequence loops that are not a
    fusable LSTM; whatever was added to the subgraph is then taken out again.
    """
    body = function_graph(ctx.scope.graph, ctx.attr("body").name)
    if not any(op.type == "TensorListGetItem" for op in body.get_operations()):
        return None
    call = CompositeCall(
        name="keras3_lstm_loop", attrs={}, inputs=[], output_dtypes=[None] * len(ctx.op.outputs),
        output_shapes=[()] * len(ctx.op.outputs), subgraph=ctx.sg, function=body,
        label=_label(ctx.op.name))
    cond = function_graph(ctx.scope.graph, ctx.attr("cond").name)

    def fusion(c: CompositeCall) -> list:
        try:
            loop = _match(ctx, body, cond)
            return _emit(ctx, c, loop)
        except _Mismatch as exc:
            raise reject(c, str(exc)) from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            # A graph shape the matcher did not foresee: report it, convert the loop as is.
            raise reject(c, f"the loop could not be matched ({type(exc).__name__}: {exc})") from exc

    values = guarded(fusion)(call)
    return LoopFusion(values, call.notes)


def _label(op_name: str) -> str:
    """The layer's scope: ``functional/lstm/while`` -> ``functional/lstm``."""
    return op_name[:-len("/while")] if op_name.endswith("/while") else op_name


# -- graph helpers -------------------------------------------------------------------------------

def _strip(t):
    """``t`` seen through Identity ops."""
    while t.op.type in ("Identity", "IdentityN"):
        t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
    return t


def _same(a, b) -> bool:
    return a.name == b.name and a.graph is b.graph


def _const(t) -> np.ndarray | None:
    t = _strip(t)
    if t.op.type != "Const":
        return None
    return np.asarray(tf().make_ndarray(t.op.get_attr("value")))


def _int_const(t) -> int | None:
    v = _const(t)
    return None if v is None or v.size != 1 else int(v.reshape(()))


def _placeholder_index(fg, t) -> int | None:
    t = _strip(t)
    for i, p in enumerate(fg.inputs):
        if _same(p, t):
            return i
    return None


# -- the loop's structure ------------------------------------------------------------------------

@dataclass
class _Loop:
    """Roles of the While's loop variables and the recognised cell."""

    n: int
    passthrough: set[int]
    counters: list[int]          # step counters (start 0, +1), the TF loop counter included
    time: int                    # the counter the list is read with
    in_list: int
    out_list: int
    h: int
    c: int
    all_steps: bool              # SetItem at the step (return_sequences) or at 0
    activation: Activation
    weights: LstmWeights


def _match(ctx, body, cond) -> _Loop:
    n = len(ctx.op.inputs)
    if len(body.inputs) != n or len(body.outputs) != n:
        raise _Mismatch("the loop body does not take and return every loop variable")
    _refuse_effects(body)
    outs = [_strip(t) for t in body.outputs]
    passthrough = {i for i in range(n) if _same(outs[i], body.inputs[i])}
    carried = [i for i in range(n) if i not in passthrough]
    counters = [i for i in carried if _is_increment(outs[i], body.inputs[i])]
    if any(op.type in ("Select", "SelectV2") for op in body.get_operations()):
        raise _Mismatch(f"a mask reaches the layer (the loop selects between steps); {UNI_OP} "
                        "has no mask operand")
    gets = [op for op in body.get_operations() if op.type == "TensorListGetItem"]
    sets = [op for op in body.get_operations() if op.type == "TensorListSetItem"]
    if len(gets) != 1:
        raise _Mismatch(f"the loop reads {len(gets)} TensorLists per step (an LSTM reads one sequence)")
    get = gets[0]
    in_list = _placeholder_index(body, get.inputs[0])
    time = _placeholder_index(body, get.inputs[1])
    if in_list is None or in_list not in passthrough:
        raise _Mismatch("the sequence read in the loop is not a loop invariant")
    if time is None or time not in counters:
        raise _Mismatch("the sequence is not read at the step counter")
    for i in counters:
        start = value_of(ctx.value(i)) if isinstance(ctx.value(i), Tensor) else None
        if start is None or start.size != 1 or int(start.reshape(())) != 0:
            raise _Mismatch(f"loop counter {i} does not start at 0")
    if len(sets) != 1:
        raise _Mismatch(f"the loop writes {len(sets)} TensorLists per step (an LSTM writes one)")
    out_list, all_steps = _output_list(body, sets[0], outs, carried, time)
    states = [i for i in carried if i not in counters and i != out_list]
    if len(states) != 2:
        raise _Mismatch(f"the loop carries {len(states)} state value(s) besides its counters and "
                        "output list; an LSTM carries two, h and c (a GRU or SimpleRNN carries one)")
    item = _strip(sets[0].inputs[2])
    h = next((i for i in states if _same(outs[i], item)), None)
    if h is None:
        raise _Mismatch("the value written to the output list is not a carried state")
    c = states[1] if h == states[0] else states[0]
    _check_inputs(ctx, in_list, out_list, all_steps)
    for i in counters:
        if ctx.op.outputs[i].consumers():
            raise _Mismatch("the loop's step count is used after the loop")
    _check_length(ctx, body, cond, counters, in_list, passthrough)
    activation, gates = _match_cell(outs[h], outs[c], body.inputs[c])
    weights = _weights(ctx, body, get.outputs[0], body.inputs[h], body.inputs[c], gates,
                       passthrough)
    return _Loop(n, passthrough, counters, time, in_list, out_list, h, c, all_steps,
                 activation, weights)


_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "StatefulPartitionedCall")


def _refuse_effects(body) -> None:
    for op in body.get_operations():
        if op.type in _WRITES or op.type.startswith("ResourceScatter"):
            raise _Mismatch(f"the loop body has side effects ({op.type} {op.name!r})")


def _is_increment(out, placeholder) -> bool:
    if out.op.type not in ("AddV2", "Add"):
        return False
    a, b = out.op.inputs
    for p, one in ((a, b), (b, a)):
        if _same(_strip(p), placeholder) and _int_const(one) == 1:
            return True
    return False


def _output_list(body, setitem, outs, carried, time) -> tuple[int, bool]:
    k = _placeholder_index(body, setitem.inputs[0])
    if k is None or k not in carried or not _same(outs[k], setitem.outputs[0]):
        raise _Mismatch("the output TensorList is not carried from step to step")
    index = _strip(setitem.inputs[1])
    if _placeholder_index(body, index) == time:
        return k, True
    if _int_const(index) == 0:
        return k, False
    raise _Mismatch("the step's output is written at neither the step nor index 0")


def _check_inputs(ctx, in_list, out_list, all_steps) -> None:
    src = ctx.value(in_list)
    if not isinstance(src, TensorListValue) or _strip(ctx.op.inputs[in_list]).op.type != "TensorListFromTensor":
        raise _Mismatch("the sequence is not a TensorList made from a tensor (TensorListFromTensor)")
    if src.tensor.rank != 3:
        raise _Mismatch(f"the sequence has shape {list(src.tensor.signature)}; the fused op "
                        "takes [time, batch, features]")
    if src.tensor.dtype != DType.FLOAT32:
        raise _Mismatch(f"{UNI_OP} is float32; the sequence is {src.tensor.dtype.name}")
    out = ctx.value(out_list)
    if not isinstance(out, TensorListValue):
        raise _Mismatch("the output list is not a TensorList kiln lowered")
    if not all_steps and out.tensor.signature[0] != 1:
        raise _Mismatch("the last output is written into a list of more than one element")


def _check_length(ctx, body, cond, counters, in_list, passthrough) -> None:
    """The loop runs exactly as many steps as the sequence has."""
    if len(cond.inputs) != len(body.inputs):
        raise _Mismatch("the loop condition does not take the loop variables")
    bounds = []
    _cond_bounds(cond, _strip(cond.outputs[0]), counters, bounds)
    if not bounds:
        raise _Mismatch("the loop condition tests no step counter")
    length = ctx.value(in_list).tensor.signature[0]
    seq_src = _dim_source(_strip(ctx.op.inputs[in_list]).op.inputs[0], 0)
    exact = False
    for kind, bound in bounds:
        if kind == "const":
            value = bound
        else:
            if bound not in passthrough:
                raise _Mismatch("the loop's bound changes from step to step")
            v = ctx.value(bound)
            arr = value_of(v) if isinstance(v, Tensor) else None
            if arr is not None and arr.size == 1:
                value = int(arr.reshape(()))
            elif arr is None and _is_length(ctx.op.inputs[bound], seq_src):
                exact = True
                continue
            else:
                raise _Mismatch("the loop's bound is not the sequence length")
        if value < 0:
            continue  # tf.while_loop without maximum_iterations: no bound
        if length < 0 or value < length:
            raise _Mismatch(f"the loop stops after {value} steps, not at the sequence's end")
        exact = exact or value == length
    if not exact:
        raise _Mismatch("the loop does not stop at the sequence's end")


def _cond_bounds(cond, t, counters, bounds: list) -> None:
    """Collect the bounds of ``counter < bound`` terms joined by LogicalAnd: ("const", n) or
    ("arg", loop-variable position it is read from)."""
    op = t.op
    if op.type == "LogicalAnd":
        for x in op.inputs:
            _cond_bounds(cond, _strip(x), counters, bounds)
        return
    if op.type == "Less":
        k = _placeholder_index(cond, op.inputs[0])
        if k in counters:
            value = _int_const(op.inputs[1])
            if value is not None:
                bounds.append(("const", value))
                return
            j = _placeholder_index(cond, op.inputs[1])
            if j is not None:
                bounds.append(("arg", j))
                return
    raise _Mismatch(f"the loop condition is not 'step < length' ({op.type} {op.name!r})")


def _dim_source(t, axis: int):
    """(tensor, axis) whose size ``t``'s dim ``axis`` is, through reverses and transposes."""
    while True:
        t = _strip(t)
        op = t.op
        if op.type == "ReverseV2":
            t = op.inputs[0]
        elif op.type == "Transpose":
            perm = _const(op.inputs[1])
            if perm is None:
                return t, axis
            t, axis = op.inputs[0], int(perm[axis])
        else:
            return t, axis


def _is_length(t, seq_src) -> bool:
    """Whether ``t`` is ``shape(seq)[0]`` (``tf.shape(x)[k]`` of the sequence's source)."""
    t = _strip(t)
    op = t.op
    if op.type != "StridedSlice" or _strip(op.inputs[0]).op.type != "Shape":
        return False
    begin, end, strides = (_const(x) for x in op.inputs[1:4])
    if begin is None or end is None or strides is None or begin.shape != (1,):
        return False
    if op.get_attr("shrink_axis_mask") != 1 or int(strides[0]) != 1:
        return False
    src, axis = _dim_source(_strip(op.inputs[0]).op.inputs[0], int(begin[0]))
    return _same(src, seq_src[0]) and axis == seq_src[1]


# -- the cell --------------------------------------------------------------------------------

def _operands(t, types) -> tuple | None:
    t = _strip(t)
    if t.op.type not in types:
        return None
    return _strip(t.op.inputs[0]), _strip(t.op.inputs[1])


def _gate(t, what: str):
    """The pre-activation of a sigmoid gate."""
    t = _strip(t)
    if t.op.type != "Sigmoid":
        raise _Mismatch(f"the {what} gate is computed by {t.op.type}, not Sigmoid "
                        f"(recurrent_activation is not sigmoid; {UNI_OP}'s gates always are)")
    return t.op.inputs[0]


def _activation_of(t):
    """(op type, its input) when ``t`` is a cell activation (or Sigmoid), else (None, t)."""
    t = _strip(t)
    if t.op.type in CELL_ACTIVATIONS or t.op.type == "Sigmoid":
        return t.op.type, _strip(t.op.inputs[0])
    return None, t


def _sigmoid_cell() -> _Mismatch:
    return _Mismatch(f"the cell goes through Sigmoid (activation='sigmoid'); {UNI_OP}'s cell "
                     "activation is tanh, relu or relu6")


def _match_cell(h_new, c_new, c_prev):
    """(activation, {gate: pre-activation tensor}) of ``h = o * act(c)``,
    ``c = f * c_prev + i * act(g)``."""
    pair = _operands(h_new, ("Mul",))
    if pair is None:
        raise _Mismatch(f"the new h is {h_new.op.type}, not sigmoid(o) * act(c): not an LSTM cell")
    act, gate_o = None, None
    for p, q in (pair, pair[::-1]):
        if _same(q, c_new):
            raise _Mismatch("the cell state is not passed through an activation "
                            f"(activation='linear'); {UNI_OP}'s NONE does not compute a linear cell")
        kind, inner = _activation_of(q)
        if kind is not None and _same(inner, c_new):
            if kind == "Sigmoid":
                raise _sigmoid_cell()
            act, gate_o = kind, p
            break
    if act is None:
        raise _Mismatch("the new h is not sigmoid(o) * act(c) of the new cell state: not an LSTM cell")
    terms = _operands(c_new, ("AddV2", "Add"))
    if terms is None:
        raise _Mismatch(f"the new cell state is {c_new.op.type}, not f * c + i * g: not an LSTM cell")
    gates = {"o": _gate(gate_o, "output")}
    for m_f, m_i in (terms, terms[::-1]):
        forget = _operands(m_f, ("Mul",))
        if forget is None or not any(_same(x, c_prev) for x in forget):
            continue
        gates["f"] = _gate(forget[1] if _same(forget[0], c_prev) else forget[0], "forget")
        update = _operands(m_i, ("Mul",))
        for p, q in (update, update[::-1]) if update else ():
            kind, inner = _activation_of(q)
            if kind is None or _strip(p).op.type != "Sigmoid":
                continue
            if kind == "Sigmoid":
                raise _sigmoid_cell()
            if kind != act:
                raise _Mismatch(f"the cell candidate uses {kind} and the cell output {act}; "
                                f"{UNI_OP} has one activation for both")
            gates["i"], gates["c"] = _gate(p, "input"), inner
            break
        break
    if set(gates) != set("ifco"):
        raise _Mismatch("the new cell state is not sigmoid(f) * c + sigmoid(i) * act(g): not an "
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
            raise _Mismatch("gate terms of different widths are added")
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
        if _same(t, self.x_t):
            return _Affine({"x": np.eye(self.n_in, dtype=np.float64)}, np.zeros(self.n_in))
        if _same(t, self.h_prev):
            return _Affine({"h": np.eye(self.units, dtype=np.float64)}, np.zeros(self.units))
        if _same(t, self.c_prev):
            raise _Mismatch("a gate reads the previous cell state (peephole connections); "
                            "Keras' LSTM has none")
        op = t.op
        kind = op.type
        if kind in ("Identity", "IdentityN", "StopGradient", "Snapshot"):
            return self(op.inputs[t.value_index if kind == "IdentityN" else 0])
        if kind == "Const":
            value = _const(t)
            return value.astype(np.float64) if value.dtype.kind == "f" else value
        if kind == "Placeholder":
            return self._argument(t)
        if kind == "ReadVariableOp":
            return self._variable(op.inputs[0])
        if kind == "Cast":
            value = self(op.inputs[0])
            if op.get_attr("DstT").name not in ("float32", "float64") and isinstance(value, _Affine):
                raise _Mismatch(f"a gate term is cast to {op.get_attr('DstT').name}")
            return value
        handler = _OPS.get(kind)
        if handler is None:
            raise _Mismatch(f"a gate pre-activation uses {kind} ({op.name!r}); the fused op "
                            "computes x·W + h·R + b")
        return handler(self, op, t)

    def _argument(self, t):
        k = _placeholder_index(self.body, t)
        if k is None or k not in self.passthrough:
            raise _Mismatch(f"a gate reads loop variable {k}, which changes from step to step")
        v = self.ctx.value(k)
        arr = value_of(v) if isinstance(v, Tensor) else None
        if arr is None:
            raise _Mismatch(f"a gate reads loop variable {k}, which is not a constant")
        return np.asarray(arr, np.float64) if arr.dtype.kind == "f" else arr

    def _variable(self, handle):
        k = _placeholder_index(self.body, handle)
        v = self.ctx.value(k) if k is not None and k in self.passthrough else None
        if not isinstance(v, ResourceRef):
            raise _Mismatch("a weight is not a variable the loop gets from outside")
        if v.var.mutable:
            raise _Mismatch(f"weight {v.var.name!r} is a variable the model assigns")
        arr = np.asarray(v.var.value())
        return arr.astype(np.float64) if arr.dtype.kind == "f" else arr


def _consts(ev: _Evaluator, op, tensors) -> list:
    values = [ev(t) for t in tensors]
    if any(isinstance(v, _Affine) for v in values):
        raise _Mismatch(f"{op.type} {op.name!r} slices a gate term, not a weight")
    return [np.asarray(v) for v in values]


def _matmul(ev: _Evaluator, op, t):
    if op.type == "MatMul":
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    else:
        ta, tb = op.get_attr("adj_x"), op.get_attr("adj_y")
    a, b = ev(op.inputs[0]), ev(op.inputs[1])
    if isinstance(b, _Affine) or (isinstance(a, _Affine) and ta):
        raise _Mismatch(f"{op.type} {op.name!r} does not multiply a step's row by a weight")
    b = np.asarray(b)
    if b.ndim != 2:
        raise _Mismatch(f"{op.type} {op.name!r} multiplies by a {b.ndim}-D weight")
    b = b.T if tb else b
    if isinstance(a, _Affine):
        if b.shape[0] != a.width:
            raise _Mismatch(f"{op.type} {op.name!r}: weight of shape {list(b.shape)} for width {a.width}")
        return _Affine({k: w @ b for k, w in a.terms.items()}, a.bias @ b)
    a = np.asarray(a)
    return (a.T if ta else a) @ b


def _vector(ev: _Evaluator, value, width: int, what: str) -> np.ndarray:
    v = np.asarray(value, np.float64)
    if v.ndim == 0:
        return np.full(width, float(v))
    if v.shape in ((width,), (1, width)):
        return v.reshape(width)
    raise _Mismatch(f"{what} adds a term of shape {list(v.shape)} to gates of width {width}")


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
        raise _Mismatch(f"Mul {op.name!r} multiplies two gate terms")
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
            raise _Mismatch(f"{op.type} {op.name!r} splits the gates along axis {axis}")
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
            raise _Mismatch(f"cannot split width {width} into {n} parts")
        sizes = [width // n] * n
    sizes = [int(s) for s in sizes]
    if -1 in sizes:
        sizes[sizes.index(-1)] = width - (sum(sizes) + 1)
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])]


def _strided_slice(ev: _Evaluator, op, t):
    value, begin, end, strides = _consts(ev, op, op.inputs[:4])
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        raise _Mismatch(f"StridedSlice {op.name!r} uses ellipsis / new axes")
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
        raise _Mismatch(f"ConcatV2 {op.name!r} joins a step's row with a weight")
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


def _weights(ctx, body, x_t, h_prev, c_prev, gates, passthrough) -> LstmWeights:
    n_in = (shape_signature(x_t.shape) or (-1,))[-1]
    if n_in < 0:
        n_in = ctx.value(_placeholder_index(body, x_t.op.inputs[0])).tensor.signature[-1]
    units = (shape_signature(h_prev.shape) or (-1,))[-1]
    if n_in < 0 or units < 0:
        raise _Mismatch("the step's input or state has an unknown width")
    ev = _Evaluator(ctx, body, x_t, h_prev, c_prev, passthrough, n_in, units)
    blocks: dict[str, dict[str, np.ndarray]] = {"input": {}, "recurrent": {}, "bias": {}}
    for g, z in gates.items():
        form = ev(z)
        if not isinstance(form, _Affine):
            raise _Mismatch(f"the {g} gate does not depend on the step's input")
        if form.width != units or set(form.terms) - {"x", "h"}:
            raise _Mismatch(f"the {g} gate has width {form.width}, the state {units}")
        wx = form.terms.get("x", np.zeros((n_in, units)))
        wh = form.terms.get("h", np.zeros((units, units)))
        blocks["input"][g] = np.ascontiguousarray(wx.T, np.float32)
        blocks["recurrent"][g] = np.ascontiguousarray(wh.T, np.float32)
        blocks["bias"][g] = np.ascontiguousarray(form.bias, np.float32)
    return LstmWeights(**blocks)


# -- emitting ----------------------------------------------------------------------------------

@dataclass
class _Fused:
    """A loop fused into a UNIDIRECTIONAL op, remembered so that its mirror image (the other
    direction of a Bidirectional) can merge with it."""

    label: str
    op: Operator
    base: Tensor                 # the sequence before any reversal
    reversed: bool
    time_major: bool
    activation: Activation
    weights: LstmWeights
    initial: tuple               # (h0, c0): IR tensors, None for zeros
    result: LstmResult
    note: str
    merged: bool = False


@dataclass
class _Direction:
    """One direction of an emitted LSTM as the loop's outputs need it."""

    res: LstmResult
    d: int = 0
    flip: bool = False           # outputs aligned with the input: reverse to processing order

    def sequence(self, b: FusionBuilder) -> Tensor:
        seq = self.res.direction_output(self.d)
        return b.reverse(seq, self.res.time_axis, what="processing_order") if self.flip else seq

    def last(self) -> Tensor:
        return self.res.last_output(self.d)

    def cell(self) -> Tensor:
        return self.res.final_cell_state(self.d)


def _emit(ctx, call: CompositeCall, loop: _Loop) -> list:
    b = FusionBuilder(call)
    seq = ctx.value(loop.in_list).tensor
    base, rev, tm = _sequence(seq)
    initial = tuple(_initial(ctx.value(i), loop.weights.n_output) for i in (loop.h, loop.c))
    batch = base.signature[1 if tm else 0]
    for t in initial:
        if t is not None and t.signature[0] >= 0 and t.signature[0] != batch:
            raise _Mismatch(f"the initial state has a fixed batch of {t.signature[0]}, the sequence "
                            f"{'a dynamic one' if batch < 0 else batch}; the fused op's state must "
                            "match its input (export with a fixed batch size)")
    options = LstmOptions(activation=loop.activation, time_major=tm)
    records = ctx.scope.cache.setdefault(_CACHE_KEY, [])
    partner = _partner(ctx.sg, records, base, rev, tm, loop, initial)
    if partner is not None:
        sg = ctx.sg
        n_ops, n_tensors = len(sg.operators), len(sg.tensors)
        try:
            return _emit_bidirectional(ctx, call, b, loop, partner, base, rev, initial, options)
        except KilnError:  # keep the loop fused on its own
            _rollback(sg, n_ops, n_tensors)
    x = seq if tm else (b.reverse(base, 1, what="reversed_input") if rev else base)
    res = emit_lstm(b, x, loop.weights, options, initial_state=initial)
    values = _values(ctx, b, loop, _Direction(res))
    note_fused(call, f"{UNI_OP} (Keras LSTM loop{', go_backwards' if rev else ''})")
    records.append(_Fused(call.label, res.op, base, rev, tm, loop.activation, loop.weights,
                          initial, res, call.notes[-1]))
    return values


def _sequence(seq: Tensor) -> tuple[Tensor, bool, bool]:
    """(sequence before reversal, reversed, time-major) of the list's time-major tensor:
    Keras transposes a batch-major input (and reverses it for go_backwards); the fused op
    reads the batch-major tensor, so the transposes cancel."""
    t, rev = seq, False
    p = t.producer
    if p is not None and p.op_type == "REVERSE_V2" and _const_list(p.inputs[1]) in ([0], [-3]):
        t, rev = p.inputs[0], True
        p = t.producer
    if p is not None and p.op_type == "TRANSPOSE" and _const_list(p.inputs[1]) == [1, 0, 2]:
        return p.inputs[0], rev, False
    return t, rev, True


def _const_list(t: Tensor | None) -> list | None:
    v = None if t is None else value_of(t)
    return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def _initial(v, units: int) -> Tensor | None:
    """The initial state operand: None for zeros (constant or FILL of 0), else the tensor."""
    if not isinstance(v, Tensor):
        raise _Mismatch("an initial state is not a plain tensor")
    if v.dtype != DType.FLOAT32 or v.rank != 2 or v.signature[1] != units:
        raise _Mismatch(f"an initial state has shape {list(v.signature)} ({v.dtype.name}); the "
                        f"fused op keeps float32 [batch, {units}]")
    data = value_of(v)
    if data is not None:
        return None if not np.any(data) else v
    p = v.producer
    if p is not None and p.op_type == "FILL":
        fill = value_of(p.inputs[1])
        if fill is not None and not np.any(fill):
            return None
    return v


def _values(ctx, b: FusionBuilder, loop: _Loop, direction: _Direction) -> list:
    """One value per While output (None for outputs nobody reads)."""
    values = []
    for i in range(loop.n):
        used = bool(ctx.op.outputs[i].consumers())
        if i in loop.passthrough:
            values.append(ctx.value(i))
        elif not used:
            values.append(None)
        elif i == loop.out_list:
            values.append(_output_list_value(ctx.value(i), b, loop, direction))
        elif i == loop.h:
            values.append(direction.last())
        elif i == loop.c:
            values.append(direction.cell())
        else:
            values.append(None)
    return values


def _output_list_value(out: TensorListValue, b: FusionBuilder, loop: _Loop,
                       direction: _Direction) -> TensorListValue:
    """The output TensorList as the loop leaves it: time-major, in processing order."""
    if loop.all_steps:
        seq = direction.sequence(b)
        if not direction.res.time_major:
            seq = b.transpose(seq, [1, 0, 2], what="sequence_time_major")
    else:
        last = direction.last()
        seq = b.reshape(last, [1, *last.signature], what="last_output_list")
    return TensorListValue(seq, out.element_dtype, out.element_signature)


# -- two loops, one BIDIRECTIONAL_SEQUENCE_LSTM ---------------------------------------------------

def _partner(sg, records: list, base, rev, tm, loop: _Loop, initial) -> _Fused | None:
    """An earlier fused loop over the same sequence in the other direction, with the same
    sizes and activation, before which this loop's initial states exist."""
    for rec in reversed(records):
        if rec.merged or rec.op.subgraph is not sg or rec.base is not base:
            continue
        if rec.reversed == rev or rec.time_major != tm or rec.activation != loop.activation:
            continue
        w = rec.weights
        if (w.n_cell, w.n_input, w.n_output) != (loop.weights.n_cell, loop.weights.n_input,
                                                 loop.weights.n_output):
            continue
        position = {id(op): k for k, op in enumerate(sg.operators)}
        at = position[id(rec.op)]
        if all(t is None or t.producer is None or position.get(id(t.producer), at) < at
               for t in initial):
            return rec
    return None


def _emit_bidirectional(ctx, call: CompositeCall, b: FusionBuilder, loop: _Loop,
                        partner: _Fused, base, rev, initial, options) -> list:
    """Replace ``partner``'s UNIDIRECTIONAL op by ONE BIDIRECTIONAL op computing both loops.

    The new op takes the partner's place in the operator list (everything it reads exists
    there already); the partner's readers are pointed at its direction's output and states.
    """
    sg = ctx.sg
    fw, bw = (partner, loop) if rev else (loop, partner)
    init = (*partner.initial, *initial) if rev else (*initial, *partner.initial)
    n0 = len(sg.operators)
    res = emit_bidirectional_lstm(b, base, fw.weights, bw.weights, options, initial_states=init)
    pd = 1 if partner.reversed else 0
    replacement = _Direction(res, pd, flip=pd == 1).sequence(b)
    moved = sg.operators[n0:]
    d = 1 - pd
    values = _values(ctx, b, loop, _Direction(res, d, flip=d == 1))
    at = sg.operators.index(partner.op)
    _check_movable(sg, moved, at)
    # Commit: nothing below can fail.
    old = partner.result
    old.sequence.replace_all_uses_with(replacement)
    for old_var, new_var in zip(old.states[0], res.states[pd]):
        old_var.replace_all_uses_with(new_var)
    sg.remove_operator(partner.op)
    for op in moved:
        sg.operators.remove(op)
    sg.operators[at:at] = moved
    partner.merged = True
    fused = ctx.scope.importer.stats.fused
    if partner.note in fused:
        fused.remove(partner.note)
    call.notes.append(f"{partner.label} + {call.label}: fused into one {BIDI_OP} (Keras LSTM loops)")
    return values


def _check_movable(sg, ops: list, at: int) -> None:
    """Every input of ``ops`` exists before position ``at`` (or is made by ``ops`` earlier)."""
    position = {id(op): k for k, op in enumerate(sg.operators)}
    made: set[int] = set()
    for op in ops:
        for t in op.inputs:
            if t is None or t.producer is None or id(t) in made:
                continue
            if position[id(t.producer)] >= at:
                raise KilnError(f"{op.name} reads {t.name!r}, which is computed after the "
                                "other direction's LSTM")
        made.update(id(t) for t in op.outputs if t is not None)


def _rollback(sg, n_ops: int, n_tensors: int) -> None:
    for op in reversed(sg.operators[n_ops:]):
        sg.remove_operator(op)
    for t in sg.tensors[n_tensors:]:
        t.subgraph = None
    del sg.tensors[n_tensors:]
