"""The NumPy delegate's float chains: float32 partitions run as pre-packed NumPy chains.

The float side of kiln's default delegate (kiln/delegates/delegate.py), as XNNPACK is LiteRT's.
The reference kernels are pure: they re-validate every operand, re-derive geometry and
allocate fresh arrays on every node of every invoke. This delegate does that work once per
input shape: it claims float32 nodes *at the op versions it knows* (the operator-versioning
guide's rule — a version it has not seen may mean features it does not implement), lays out
weights once, plans a persistent buffer for every tensor internal to a partition (and a
padded input for the windowed ops, kiln/delegates/windowed.py), and runs the partition as a
flat list of closures that write into those buffers with ``out=`` and clamp fused
activations in place. Each lowering does the reference kernel's arithmetic in the same order
and weight layout, so the outputs are the reference kernels', bit for bit.

Ops without a specialised lowering here (softmax, means...) run their reference kernel
inside the chain, so a partition never has to return to the interpreter for them.
Tensors that leave a partition get fresh arrays on every invoke, so nothing the interpreter
(or a WHILE loop carrying values between iterations) holds is ever overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np

from .. import ops
from ..errors import KilnError, OpError
from ..ir import Operator
from ..ops.backends import FLOAT
from ..ops.elementwise import activation_range, is_quantized
from ..kernels.family import Shaped
from ..ops.record import KernelCall
from ..runtime.delegate import DelegateKernel, Partition, ReportingDelegate
from ..schema import Activation, DType


F32 = np.dtype(np.float32)

_FC_ACTIVATIONS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)


def _one_weight_operand(name: str) -> bool:
    """Whether the op's record names operand 1 as its one weight tensor (FULLY_CONNECTED and
    the convolutions): the chain packs it once, and it must be float32 here (else hybrid)."""
    weights = ops.require(name).weights
    return weights is not None and weights.operands == (1,)


def float_check(support: "CompiledSupport", op: Operator) -> str | None:
    """None if a chain of ``support`` runs float node ``op``, else the reason (the table's check
    of the NumPy delegate's float entries, kiln/delegates/delegate.py)."""
    name = op.op_type
    if op.version not in support.versions:
        return f"{name} version {op.version} is unknown to the delegate (knows {sorted(support.versions)})"
    consts = support.const_operands
    required = 2 if _one_weight_operand(name) else 1
    if len(op.inputs) < required or any(op.inputs[k] is None for k in range(required)) or not op.outputs:
        return f"{name} has {len(op.inputs)} inputs and {len(op.outputs)} outputs; the delegate needs more"
    for k, t in enumerate(op.inputs):
        if t is None:
            continue
        if k not in consts and t.is_constant and not support.constant_data:
            return f"{name} operand {k} ({t.name!r}) is a constant; the delegate's {name} reads it at run time"
        if k in consts:
            if not t.is_constant:
                return f"{name} operand {k} ({t.name!r}) is not a constant"
            if is_quantized(t):
                return f"{name} operand {k} ({t.name!r}) is quantized"
            continue
        if t.dtype != DType.FLOAT32 or t.quantization is not None and not t.quantization.is_empty:
            return f"{name} operand {k} ({t.name!r}) is {t.dtype.name}, not plain float32"
    for t in op.outputs:
        if t is not None and t.dtype != DType.FLOAT32:
            return f"{name} output {t.name!r} is {t.dtype.name}, not float32"
    if _one_weight_operand(name) and op.inputs[1].dtype != DType.FLOAT32:
        return f"{name} weights are {op.inputs[1].dtype.name} (hybrid), not float32"
    if name == "FULLY_CONNECTED":
        opts = op.options
        if opts["weights_format"] != 0:
            return "FULLY_CONNECTED with shuffled weights"
        if opts["fused_activation_function"] not in _FC_ACTIVATIONS:
            return "FULLY_CONNECTED with an activation LiteRT does not fuse there"
    if name == "CONV_2D":
        x, w = op.inputs[0], op.inputs[1]
        if len(x.shape) == 4 and len(w.shape) == 4 and x.shape[3] != w.shape[3]:
            return "grouped CONV_2D"
    return None


def clamp(lo, hi):
    """An in-place clamp of a float32 array to [lo, hi], bit for bit ``np.clip``'s.

    With two non-zero bounds it is np.maximum then np.minimum, two plain ufunc calls: a value
    equal to a bound is that bound either way and NaN passes both. A zero bound keeps
    ``ndarray.clip``, which leaves -0.0 as it is (as LiteRT's std::max does) where np.maximum
    may not.
    """
    lo, hi = F32.type(lo), F32.type(hi)
    if lo != 0 and hi != 0:
        def apply(y):
            np.maximum(y, lo, out=y)
            np.minimum(y, hi, out=y)
    else:
        def apply(y):
            y.clip(lo, hi, out=y)
    return apply


# -- compilation -------------------------------------------------------------------------------

@dataclass
class Node:
    """One node as a lowering sees it (both chains): options, kernel call, operand constants and
    slots. The float chains add the operand shapes and which outputs leave the partition; the
    integer chains, prepared by a checked first run, its input arrays and the reference
    kernel's outputs on them."""

    op: Operator
    opts: SimpleNamespace
    call: KernelCall
    kernel: Callable
    label: str
    ins: list                # constants, first-run arrays (integer chains) or shapes (float chains); None: omitted
    consts: list             # constant operands (None where the operand is not a constant)
    in_slots: list[int]      # -1 for constants and omitted operands
    out_slots: list[int]
    fresh: list[bool]        # output leaves the partition: give it a new array every invoke
    expected: list = field(default_factory=list)   # the reference kernel's outputs on the first run

    @property
    def in_shapes(self) -> list[tuple | None]:
        return [None if v is None else (tuple(c.shape) if c is not None else v) for v, c in zip(self.ins, self.consts)]

    def error(self, message: str) -> OpError:
        return OpError(f"{self.label}: {message}")

    def output(self, k: int, shape) -> Callable[[], np.ndarray]:
        """A getter for output ``k``'s buffer: persistent if internal, fresh if it escapes
        (C-level callables, so a call costs no Python frame)."""
        shape = tuple(int(d) for d in shape)
        if self.fresh[k]:
            return partial(np.empty, shape, F32)
        return repeat(np.empty(shape, F32)).__next__


Step = Callable[[list], None]
Lowering = Callable[[Node], tuple[Step, list[tuple]]]


def operand(node: Node, k: int):
    """(slot, constant) of operand k: exactly one of them is meaningful."""
    return node.in_slots[k], (node.consts[k] if k < len(node.consts) else None)


def _activations(node: Node, fmt) -> list[tuple]:
    return [operand(node, k) if k < len(node.in_slots) else (-1, None) for k in fmt.activations]


def family_step(node: Node, fmt, prepared) -> Step:
    """The step of a node of an op with a kernel family (kiln.kernels.family): its format's
    ``run`` on NumPy over the ``prepared`` constants and the activations the slots hold. The
    result may be a buffer the prepared kernel keeps: an output that leaves the partition is copied."""
    operands = _activations(node, fmt)
    run, oi, fresh = fmt.run, node.out_slots[0], node.fresh[0]
    single = operands[0][0] if len(operands) == 1 and operands[0][1] is None else -1   # the common case

    def step(slots):
        if single >= 0:
            y = run(np, prepared, slots[single])
        else:
            y = run(np, prepared, *[c if c is not None else (slots[s] if s >= 0 else None) for s, c in operands])
        slots[oi] = y.copy() if fresh else y

    return step


def lower_family(node: Node):
    """An op with a kernel family: its float format prepared once per input shape — weights
    laid out, geometry, padded buffers — and run on each invoke: the reference kernel's own
    arithmetic, so its bits."""
    fmt = ops.require(node.op.op_type).formats[FLOAT]
    inputs = [c if c is not None else (None if shape is None else Shaped(shape, F32))
              for shape, c in zip(node.in_shapes, node.consts)]
    try:
        prepared = fmt.prepare(node.call, inputs)
    except OpError as exc:
        raise node.error(str(exc)) from None
    with np.errstate(all="ignore"):
        probe = fmt.run(np, prepared, *[c if c is not None else (None if s < 0 else np.zeros(node.in_shapes[k], F32))
                                        for k, (s, c) in zip(fmt.activations, _activations(node, fmt))])
    return family_step(node, fmt, prepared), [probe.shape]


def lower_binary(ufunc) -> "Lowering":
    """A broadcasting arithmetic node (ADD, SUB, MUL) as ``ufunc`` into its output buffer,
    then its fused activation's clamp in place, as the reference kernel computes it."""
    return partial(_lower_binary, ufunc)


def _lower_binary(ufunc, node: Node):
    (sa, ca), (sb, cb) = operand(node, 0), operand(node, 1)
    try:
        out_shape = np.broadcast_shapes(node.in_shapes[0], node.in_shapes[1])
    except ValueError:
        raise node.error(f"shapes {list(node.in_shapes[0])} and {list(node.in_shapes[1])} do not "
                         "broadcast") from None
    clamp_y = clamp(*activation_range(node.opts.fused_activation_function, F32))
    ca = None if ca is None else np.asarray(ca, F32)
    cb = None if cb is None else np.asarray(cb, F32)
    get = node.output(0, out_shape)
    oi = node.out_slots[0]

    def run(slots):
        y = get()
        ufunc(slots[sa] if ca is None else ca, slots[sb] if cb is None else cb, out=y)
        clamp_y(y)
        slots[oi] = y

    return run, [out_shape]


def probe(node: Node) -> list[np.ndarray]:
    """Run the reference kernel once on zeros to learn the output shapes."""
    args = [c if c is not None else (None if shape is None else np.zeros(shape, F32))
            for shape, c in zip(node.in_shapes, node.consts)]
    with np.errstate(all="ignore"):
        result = node.kernel(node.call, *args)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def view_step(node: Node, shape) -> Step:
    """RESHAPE / SQUEEZE / EXPAND_DIMS: a view of the input in ``shape`` (a copy if it leaves
    the partition)."""
    xi, oi, fresh = node.in_slots[0], node.out_slots[0], node.fresh[0]

    def run(slots):
        y = slots[xi].reshape(shape)
        slots[oi] = y.copy() if fresh else y

    return run


def lower_view(node: Node):
    """A float view: the shape is known at compile time."""
    shape = probe(node)[0].shape
    return view_step(node, shape), [shape]


def reference_step(node: Node) -> Step:
    """The node's reference kernel called straight from the chain (what the interpreter would
    run): its outputs in their types into the output slots, a stateful op's new states (after
    its outputs, kiln.ops.record) into its state operands' slots."""
    kernel, call = node.kernel, node.call
    pairs = list(zip(node.in_slots, node.consts))
    outs = list(zip(node.out_slots, node.fresh, call.out_dtypes))
    states = [node.in_slots[k] for k in ops.require(node.op.op_type).state_operands]

    def run(slots):
        result = kernel(call, *[c if c is not None else (slots[s] if s >= 0 else None) for s, c in pairs])
        if not isinstance(result, (tuple, list)):
            result = (result,)
        for (oi, fresh, dtype), value in zip(outs, result):
            if oi < 0 or value is None:
                continue
            value = np.asarray(value)
            value = value if value.dtype == dtype else value.astype(dtype)
            slots[oi] = value.copy() if fresh and not value.flags.owndata else value
        for s, value in zip(states, result[len(outs):]):
            if s >= 0 and value is not None:
                slots[s] = value

    return run


def _lower_reference(node: Node):
    """Any other claimed op: its reference kernel, called straight from the chain."""
    return reference_step(node), [r.shape for r in probe(node)[:len(node.op.outputs)]]


@dataclass(frozen=True)
class CompiledSupport:
    """What the delegate knows of one op: the versions it claims (higher versions add integer,
    hybrid or sparse variants, op_version.cc, that the chains do not implement), operand
    positions that must be constant so the chain packs them at prepare time, its lowering
    (None: the reference kernel runs inside the chain), and whether that lowering takes a
    constant wherever a run-time operand may stand (`operand`); a lowering that reads its data
    operands from slots leaves a node computing on constants to its kernel."""

    versions: frozenset[int]
    const_operands: tuple[int, ...] = ()
    lower: Lowering | None = None
    constant_data: bool = False

    def check(self, op: Operator) -> str | None:
        """The delegate table's check of this entry (`float_check`)."""
        return float_check(self, op)


class _Plan:
    """A partition compiled for one set of input shapes."""

    def __init__(self, steps: list[Step], n_slots: int, out_slots: list[int], n_inputs: int):
        self.steps = steps
        self.n_slots = n_slots
        self.out_slots = out_slots
        self.unset = [None] * (n_slots - n_inputs)  # the slots the steps fill


class Chain(DelegateKernel):
    """What the float and integer chains share: a slot per partition input and node output,
    the nodes as lowerings see them, and up to MAX_PLANS plans, one per input signature."""

    MAX_PLANS = 8

    def __init__(self, delegate: ReportingDelegate, partition: Partition):
        self.delegate = delegate
        self.partition = partition
        self.nodes = partition.nodes
        self.plans: dict[tuple, object] = {}
        slot: dict[int, int] = {}
        for t in partition.inputs:
            slot[id(t)] = len(slot)
        for info in self.nodes:
            for t in info.op.outputs:
                if t is not None:
                    slot[id(t)] = len(slot)
        self.slot = slot
        self.escaping = {id(t) for t in partition.outputs}
        self.out_slots = [slot[id(t)] for t in partition.outputs]
        #: Partition inputs its nodes update (an LSTM's states): their final values follow the
        #: outputs, as a stateful reference kernel returns them.
        self.state_slots = [slot[id(partition.inputs[k])] for k in partition.state_inputs]

    def plan(self, key: tuple, build: Callable):
        """The plan for ``key``, built by ``build()`` if new (the oldest goes beyond MAX_PLANS)."""
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= self.MAX_PLANS:
                self.plans.pop(next(iter(self.plans)))
            plan = self.plans[key] = build()
        return plan

    def node(self, info, kernel: Callable, out_dtypes: list, value: Callable) -> Node:
        """Node ``info`` for a lowering: ``value(slot, tensor, label)`` is what ``Node.ins`` holds
        for an operand the partition computes (its shape, or its array on the first run)."""
        op = info.op
        label = f"{self.delegate.name} delegate, node {info.index} ({info.name})"
        in_slots, consts, ins = [], [], []
        for t in op.inputs:
            if t is None:
                in_slots.append(-1), consts.append(None), ins.append(None)
            elif t.is_constant:
                in_slots.append(-1), consts.append(t.data), ins.append(t.data)
            else:
                s = self.slot[id(t)]
                in_slots.append(s), consts.append(None), ins.append(value(s, t, label))
        opts = ops.require(op.op_type).make_options(op.options)
        return Node(op, opts, KernelCall(opts, op, out_dtypes), kernel, label, ins, consts, in_slots,
                    [-1 if t is None else self.slot[id(t)] for t in op.outputs],
                    [t is not None and id(t) in self.escaping for t in op.outputs])


class ChainKernel(Chain):
    """A claimed float partition: compiled per input-shape signature, then a flat list of closures."""

    def _compile(self, shapes: tuple) -> _Plan:
        known: dict[int, tuple] = {i: s for i, s in enumerate(shapes)}

        def shape(s, t, label):
            if s not in known:
                raise OpError(f"{label}: reads {t.name!r} before the partition computes it")
            return known[s]

        steps = []
        for info in self.nodes:
            op = info.op
            node = self.node(info, ops.require(op.op_type).kernel, [F32 for _ in op.outputs], shape)
            lower = self.delegate.lowerings[op.op_type, FLOAT].lower or _lower_reference
            try:
                run, out_shapes = lower(node)
            except KilnError:
                raise
            except Exception as exc:  # a shape the lowering cannot handle: say where
                raise OpError(f"{node.label}: cannot compile for input shapes {node.in_shapes}: "
                              f"{type(exc).__name__}: {exc}") from exc
            for s, out_shape in zip(node.out_slots, out_shapes):
                if s >= 0:
                    known[s] = tuple(out_shape)
            steps.append(run)
        return _Plan(steps, len(self.slot), self.out_slots, len(self.partition.inputs))

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        key = tuple([x.shape for x in inputs])
        plan = self.plan(key, lambda: self._compile(key))
        # Every input is a FLOAT32 tensor (float_check), which the interpreter keeps as float32.
        slots = [*inputs, *plan.unset]
        with np.errstate(all="ignore"):  # as the reference kernels: LiteRT's float math never warns
            for run in plan.steps:
                run(slots)
        if self.state_slots:
            return [slots[s] for s in plan.out_slots] + [slots[s] for s in self.state_slots]
        return [slots[s] for s in plan.out_slots]
