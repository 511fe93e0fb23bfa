"""The quantized delegate's lowerings of SOFTMAX, CONCATENATION / PACK, the 16x8 ADD / SUB /
MUL and QUANTIZE from float.

Each gives its reference kernel's bits with the per-node work done once: SOFTMAX's exp table
over every distance to the row maximum (256 for 8 bits, in fixed point; 65536 for int16), ADD / SUB's
rescaling of each int16 input code as a 65536-entry table (the output rescaling stays
per element, `Requantizer`), MUL's multiplier. A lowering returns None where it does not
handle a node (the delegate then runs the node's reference kernel in the chain).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..kernels import softmax as sm
from ..kernels import elementwise
from ..kernels.fixedpoint import Requantizer, activation_range
from ..kernels.fixedpoint import multiply_by_quantized_multiplier_double_rounding as rescale
from ..schema import Activation
from .compiled import Node, operand
from .quantized import per_tensor

F32, F64, I64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def _in_qp(node: Node, k: int):
    return node.op.inputs[k].quantization


def _out_qp(node: Node):
    return node.op.outputs[0].quantization


# -- SOFTMAX ------------------------------------------------------------------------------------

def lower_softmax(node: Node) -> Callable | None:
    """int8 / int16 SOFTMAX over the last axis: the reference kernel's `sm.softmax_codes`, its
    tables made once; a row BUILTIN_REF aborts on gets the kernel's own answer (LiteRT's
    optimized kernel's values)."""
    x = node.ins[0]
    out_dtype = node.call.out_dtypes[0]
    if x.ndim == 0 or x.shape[-1] == 0 or not per_tensor(node.op):
        return None
    if x.dtype != np.int8 and (x.dtype != np.int16 or out_dtype != np.int16):
        return None
    run = sm.softmax_codes(x.dtype, _in_qp(node, 0), _out_qp(node), float(node.opts.beta), out_dtype)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def step(slots):
        slots[oi] = run(np, slots[xi])

    return step


# -- CONCATENATION / PACK -----------------------------------------------------------------------

def _same_params(node: Node) -> bool:
    out_qp = _out_qp(node)
    for t in node.op.inputs:
        q = t.quantization
        if q is None or q.scale.size != 1 or F32.type(q.scale[0]) != F32.type(out_qp.scale[0]) \
                or int(q.zero_point[0]) != int(out_qp.zero_point[0]):
            return False
    return True


def lower_concatenation(node: Node) -> Callable | None:
    """CONCATENATION of inputs sharing the output's parameters (LiteRT requantizes nothing
    and refuses anything else — the kernel raised on the first run): a copy into the output."""
    if any(t is None for t in node.op.inputs) or not _same_params(node) or node.expected[0].ndim == 0:
        return None
    if Activation(node.opts.fused_activation_function) != Activation.NONE:
        return None
    axis = int(node.opts.axis) % node.expected[0].ndim
    return _stacking(node, lambda xs, out: np.concatenate(xs, axis=axis, out=out))


def lower_pack(node: Node) -> Callable | None:
    """PACK of inputs sharing the output's parameters: ``np.stack`` into the output."""
    if any(t is None for t in node.op.inputs) or not _same_params(node):
        return None
    axis = int(node.opts.axis) % node.expected[0].ndim
    return _stacking(node, lambda xs, out: np.stack(xs, axis=axis, out=out))


def _stacking(node: Node, join) -> Callable | None:
    expected = node.expected[0]
    if any(x.dtype != expected.dtype for x in node.ins):
        return None
    operands = [operand(node, k) for k in range(len(node.ins))]
    shape, dtype = expected.shape, expected.dtype
    oi = node.out_slots[0]

    def run(slots):
        out = np.empty(shape, dtype)
        join([c if c is not None else slots[s] for s, c in operands], out)
        slots[oi] = out

    return run


# -- 16x8 ADD / SUB / MUL -----------------------------------------------------------------------

def _int16_codes() -> np.ndarray:
    return np.arange(-32768, 32768, dtype=I64)


def lower_binary_int16(node: Node) -> Callable | None:
    """16x8 ADD / SUB (each input's lifted, rescaled code from a table; the sum rescaled per
    element) and MUL (the product of the centred codes rescaled per element)."""
    a, b = node.ins[0], node.ins[1]
    op_type = node.op.op_type
    if a.dtype != np.int16 or b.dtype != np.int16 or op_type not in ("ADD", "SUB", "MUL") or not per_tensor(node.op):
        return None
    a_qp, b_qp, out_qp = _in_qp(node, 0), _in_qp(node, 1), _out_qp(node)
    out_dtype = node.call.out_dtypes[0]
    activation = Activation(getattr(node.opts, "fused_activation_function", Activation.NONE))
    lo, hi = activation_range(activation, out_qp, out_dtype)
    za, zb, zy = int(a_qp.zero_point[0]), int(b_qp.zero_point[0]), int(out_qp.zero_point[0])
    (sa, ca), (sb, cb) = operand(node, 0), operand(node, 1)
    oi = node.out_slots[0]
    if op_type == "MUL":
        m, shift = elementwise.mul_multiplier(a_qp, b_qp, out_qp)
        bound = (32768 + abs(za)) * (32768 + abs(zb))
        requant = Requantizer("double", m, shift, zy, lo, hi, out_dtype, bound)
        fa = None if ca is None else np.asarray(ca, I64) - za
        fb = None if cb is None else np.asarray(cb, I64) - zb

        def run(slots):
            left = fa if fa is not None else slots[sa].astype(I64)
            if fa is None and za:
                left -= za
            right = fb if fb is not None else (slots[sb] - np.int64(zb) if zb else slots[sb])
            slots[oi] = requant(np.multiply(left, right, dtype=I64))

        return run
    (m_a, sh_a), (m_b, sh_b), (m_y, sh_y), lift = elementwise.add_sub_multipliers(a_qp, b_qp, out_qp, np.int16)
    codes = _int16_codes()
    sign = 1 if op_type == "ADD" else -1
    table_a = np.roll(rescale((codes - za) << lift, m_a, sh_a).astype(I64), -32768)   # indexed by uint16 bits
    table_b = np.roll(sign * rescale((codes - zb) << lift, m_b, sh_b).astype(I64), -32768)
    bound = int(np.abs(table_a).max()) + int(np.abs(table_b).max())
    requant = Requantizer("double", m_y, sh_y, zy, lo, hi, out_dtype, bound)
    fixed_a = None if ca is None else table_a[np.asarray(ca).view(np.uint16)]
    fixed_b = None if cb is None else table_b[np.asarray(cb).view(np.uint16)]

    def run(slots):
        ra = fixed_a if fixed_a is not None else table_a[slots[sa].view(np.uint16)]
        rb = fixed_b if fixed_b is not None else table_b[slots[sb].view(np.uint16)]
        slots[oi] = requant(np.add(ra, rb))

    return run


# -- QUANTIZE from float ------------------------------------------------------------------------

def lower_quantize_float(node: Node) -> Callable | None:
    """float32 -> int8 / uint8 / int16 QUANTIZE per tensor (kiln.ops.quantize): the float32
    quotient rounded half away in float64, saturated, offset, clamped."""
    x, q = node.ins[0], node.op.outputs[0].quantization
    out_dtype = node.call.out_dtypes[0]
    if x.dtype != np.float32 or q is None or q.scale.size != 1 or out_dtype.kind not in "iu":
        return None
    scale, zp = F32.type(q.scale[0]), int(q.zero_point[0])
    info = np.iinfo(out_dtype)
    lo, hi = int(info.min), int(info.max)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        quotient = (slots[xi] / scale).astype(F64)
        rounded = np.copysign(np.floor(np.abs(quotient) + 0.5), quotient)
        np.clip(rounded, float(lo) - 2 ** 31, float(hi) + 2 ** 31, out=rounded)
        out = rounded.astype(I64)
        if zp:
            out += zp
        np.clip(out, lo, hi, out=out)
        slots[oi] = out.astype(out_dtype)

    return run


# -- TRANSPOSE ----------------------------------------------------------------------------------

def lower_transpose(node: Node) -> Callable | None:
    """TRANSPOSE of codes with the permutation of the plan (constant or keying the plan): a
    contiguous copy of the permuted view."""
    x, expected = node.ins[0], node.expected[0]
    perm = node.ins[1]
    if perm is None or expected.dtype != x.dtype:
        return None
    perm = [int(p) % max(x.ndim, 1) for p in np.ravel(perm)]
    if sorted(perm) != list(range(x.ndim)):
        return None
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        slots[oi] = np.ascontiguousarray(slots[xi].transpose(perm))

    return run
