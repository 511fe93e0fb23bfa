"""The NumPy delegate's integer chains: quantized nodes run as per-node prepared steps, bit-exact.

The float chains (compiled.py) run float32 nodes; these run the integer-quantized nodes
(int8 / uint8 / int16 activations) and the hybrid ones of the ops the NumPy delegate's table
registers for those operand types (kiln/delegates/delegate.py). The reference kernels stay pure and re-derive multipliers,
clamp bounds and layouts on every call; here that work happens once per node and input
shape:

* weighted, windowed and reducing ops (FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D,
  BATCH_MATMUL, pooling, MEAN) have lowerings in integer_lowerings.py (hybrid ones in
  hybrid_lowerings.py), TRANSPOSE_CONV in transpose_lowerings.py;
* elementwise ops whose integer output is a function of the input codes alone (8-bit ADD,
  MUL, the activations, DEQUANTIZE, int16 table activations...) become a lookup table: the
  node's own reference kernel is run once over every code (every pair of codes for binary
  8-bit ops), so the table holds the kernel's results by construction;
* SOFTMAX, CONCATENATION / PACK, TRANSPOSE, the 16x8 ADD / SUB / MUL and QUANTIZE from float
  have lowerings in more_lowerings.py; RESHAPE / SQUEEZE / EXPAND_DIMS are views.

Shape operands (RESHAPE's shape, TRANSPOSE_CONV's output_shape, MEAN's axes...) are constants
or unquantized int32 / int64 tensors computed at run time; the values of the latter join the
key of a partition's plan, so a plan's output shapes are fixed.

A partition is prepared on its first invoke for each set of input shapes by running it
once: every node's reference kernel runs on the real data (so it raises what the
interpreter would) and its lowering's output must equal the kernel's bit for bit; a node
whose lowering disagrees keeps its reference kernel, and the delegate records why in
``fallbacks`` (the tests require it empty for the model zoo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .. import ops
from ..errors import KilnError
from ..ir import Operator
from ..kernels.family import Shaped
from ..ops.record import INT8, INT16, UINT8, operand_types
from ..runtime.delegate import Partition, ReportingDelegate
from .compiled import Chain, Node, family_step, reference_step, view_step


#: The integer operand types of the chains (hybrid nodes run there too, for weighted ops).
CODE_TYPES = (INT8, UINT8, INT16)


Lowering = Callable[[Node], "Callable | None"]


@dataclass(frozen=True)
class QuantizedSupport:
    """What the delegate knows of one op's quantized nodes: operand positions that must be
    constant (so output shapes follow from input shapes), its lowering (None: the reference
    kernel runs inside the chain), whether that lowering reads constant data operands, and
    which of the constant operands may be run-time shapes. The operand types it takes are
    the keys it is registered under."""

    const_operands: tuple[int, ...] = ()
    lower: Lowering | None = None
    #: The lowering takes a constant wherever a data operand may stand; without it a node
    #: whose operand 0 is a constant keeps its kernel (the lowering reads operand 0's slot).
    constant_data: bool = False
    #: Those of ``const_operands`` that may instead be run-time shape tensors (`_shape_like`,
    #: whose values key the plan; the lowering reads them from ``Node.ins``).
    shape_operands: tuple[int, ...] = ()

    def check(self, op: Operator) -> str | None:
        """None if an integer chain runs quantized node ``op``, else the reason (the delegate
        table's check of this entry)."""
        name = op.op_type
        key = operand_types(op)
        if key not in ops.require(name).quantized:
            return f"{name} has no {key} kernel"
        if not op.outputs or any(t is None for t in op.outputs):
            return f"{name} omits an output"
        for k in self.const_operands:
            t = op.inputs[k] if k < len(op.inputs) else None
            if t is None or t.is_constant or (k in self.shape_operands and _shape_like(t)):
                continue
            if k in self.shape_operands:
                return f"{name} operand {k} ({t.name!r}) is neither a constant nor an int32 / int64 shape tensor"
            return f"{name} operand {k} ({t.name!r}) is not a constant"
        return None


def _shape_like(t) -> bool:
    """An unquantized int32 / int64 tensor: a shape, axis or permutation computed at run
    time (SHAPE → STRIDED_SLICE → PACK); its value joins the partition's plan key."""
    return np.dtype(t.dtype.numpy) in (np.int32, np.int64) \
        and (t.quantization is None or t.quantization.scale.size == 0)


# -- lookup tables ------------------------------------------------------------------------------

def _all_codes(dtype) -> np.ndarray | None:
    """Every code of a 1- or 2-byte integer type, ordered by its unsigned bit pattern."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu" or dtype.itemsize > 2:
        return None
    unsigned = np.dtype(f"u{dtype.itemsize}")
    return np.arange(1 << (8 * dtype.itemsize), dtype=np.int64).astype(unsigned).view(dtype)


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.dtype.itemsize}")


def per_tensor(op: Operator) -> bool:
    """Whether every present tensor of ``op`` has at most one scale (not per channel)."""
    return all(t is None or t.quantization is None or t.quantization.scale.size <= 1
               for t in (*op.inputs, *op.outputs))


def lower_unary_table(node: Node) -> Callable | None:
    """An elementwise unary integer node as a table of its kernel over every input code."""
    x = node.ins[0]
    codes = _all_codes(x.dtype)
    if codes is None or not per_tensor(node.op) or len(node.op.outputs) != 1:
        return None
    try:
        table = np.asarray(node.kernel(node.call, codes, *node.ins[1:]))
    except KilnError:
        return _table_from_zero_point(node, codes)
    if table.shape != codes.shape:
        return None
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        slots[oi] = table[_unsigned(slots[xi])]

    return run


def _table_from_zero_point(node: Node, codes: np.ndarray) -> Callable | None:
    """A kernel that refuses codes below the zero point (int16 RSQRT: LiteRT refuses negative
    inputs) as a table over the codes it takes; an input holding a refused code runs the
    kernel, which raises what the interpreter would."""
    q = node.op.inputs[0].quantization
    if q is None or q.scale.size != 1:
        return None
    low = int(q.zero_point[0])
    valid = codes[codes >= low]
    try:
        values = np.asarray(node.kernel(node.call, valid, *node.ins[1:]))
    except KilnError:
        return None
    if values.shape != valid.shape:
        return None
    table = np.zeros(codes.shape, values.dtype)
    table[_unsigned(valid)] = values
    reference = reference_step(node)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        x = slots[xi]
        if x.size and x.min() < low:
            reference(slots)
        else:
            slots[oi] = table[_unsigned(x)]

    return run


def lower_binary_table(node: Node) -> Callable | None:
    """An elementwise binary node on 8-bit codes as a 256 x 256 table of its kernel."""
    a, b = node.ins[0], node.ins[1]
    if a.dtype.itemsize != 1 or b.dtype.itemsize != 1 or len(node.op.inputs) != 2 or not per_tensor(node.op):
        return None
    ca, cb = _all_codes(a.dtype), _all_codes(b.dtype)
    if ca is None or cb is None:
        return None
    try:
        np.broadcast_shapes(a.shape, b.shape)
        table = np.asarray(node.kernel(node.call, ca.reshape(256, 1), cb.reshape(1, 256)))
    except (KilnError, ValueError):
        return None
    if table.shape != (256, 256):
        return None
    flat = table.reshape(-1)
    (sa, ka), (sb, kb) = zip(node.in_slots, node.consts)
    fixed_a = None if ka is None else _unsigned(np.asarray(ka)).astype(np.intp) << 8
    fixed_b = None if kb is None else _unsigned(np.asarray(kb)).astype(np.intp)
    oi = node.out_slots[0]

    def run(slots):
        hi = fixed_a if fixed_a is not None else np.left_shift(_unsigned(slots[sa]), 8, dtype=np.intp)
        lo = fixed_b if fixed_b is not None else _unsigned(slots[sb])
        slots[oi] = flat[hi | lo]

    return run


def lower_view(node: Node) -> Callable | None:
    """RESHAPE / SQUEEZE / EXPAND_DIMS (shape operands constant): a view of the input codes in
    the shape the kernel gave on the first run."""
    x, shape = node.ins[0], node.expected[0].shape
    if node.expected[0].dtype != x.dtype or int(np.prod(shape)) != x.size:
        return None
    return view_step(node, shape)


def lower_family(node: Node) -> Callable | None:
    """An op with a kernel family (kiln.kernels.family): the node's format prepared on the
    partition's first run — constants and the plan's shape operands as values, the other
    operands as shapes — then run on each invoke (the reference kernel's arithmetic)."""
    record = ops.require(node.op.op_type)
    fmt = record.formats[operand_types(node.op)]
    inputs = [a if a is None or c is not None or _shape_like(t) else Shaped(a.shape, a.dtype)
              for a, c, t in zip(node.ins, node.consts, node.op.inputs)]
    return family_step(node, fmt, fmt.prepare(node.call, inputs))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


# -- the chain ----------------------------------------------------------------------------------

class QuantizedChain(Chain):
    """A claimed partition: prepared per input-shape signature by one checked run, then a
    flat list of steps writing into slots."""

    def __init__(self, delegate: ReportingDelegate, partition: Partition):
        super().__init__(delegate, partition)
        #: partition inputs whose values key a plan (run-time shape tensors: never quantized
        #: data, and never produced inside a partition, whose nodes all write quantized or float outputs)
        self.keyed = [k for k, t in enumerate(partition.inputs) if _shape_like(t)]

    def _prepare(self, slots: list) -> list:
        """Run the partition once on ``slots``, building (and checking) each node's step."""
        steps = []
        for info in self.nodes:
            op = info.op
            node = self.node(info, info.registration.record.kernel_for(op),
                             [np.dtype(t.dtype.numpy) for t in op.outputs], lambda s, t, label: slots[s])
            reference = reference_step(node)
            reference(slots)                   # the kernel's checks and results, on the real data
            expected = node.expected = [slots[s] for s in node.out_slots]
            step = reference
            support = self.delegate.lowerings[op.op_type, operand_types(op)]
            lower = support.lower
            if lower is not None and (support.constant_data or node.in_slots[0] >= 0):
                step = self._checked(node, lower, slots, expected) or reference
                for s, value in zip(node.out_slots, expected):
                    slots[s] = value
                if step is not reference:
                    self.delegate.lowered.add((info.index, info.name))
            steps.append(step)
        return steps

    def _checked(self, node: Node, lower: Lowering, slots: list, expected: list):
        """The node's lowering if it builds and reproduces the reference outputs, else None."""
        key = (node.op.op_type, node.label)
        try:
            step = lower(node)
            if step is None:
                return None
            step(slots)
        except (KilnError, ValueError, TypeError, IndexError) as exc:
            self.delegate.fallbacks[key] = f"{type(exc).__name__}: {exc}"
            return None
        got = [slots[s] for s in node.out_slots]
        if not all(_same(g, e) for g, e in zip(got, expected)):
            self.delegate.fallbacks[key] = "its lowering's output differs from the reference kernel's"
            return None
        return step

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        key = tuple([x.shape for x in inputs])
        if self.keyed:
            key += tuple([np.asarray(inputs[k]).tobytes() for k in self.keyed])
        slots = [*inputs, *([None] * (len(self.slot) - len(inputs)))]
        if key in self.plans:
            for run in self.plans[key]:
                run(slots)
        else:
            self.plan(key, lambda: self._prepare(slots))
        return [slots[s] for s in self.out_slots] + [slots[s] for s in self.state_slots]
