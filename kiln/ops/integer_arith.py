"""Quantized kernels of the elementwise family (ADD, SUB, MUL, DIV, SQUARED_DIFFERENCE,
RSQRT, EXP, LOG, ABS), and the helpers every quantized adapter uses
(operand parameters, fused activation); the other adapters are in kiln.ops.integer.

A module of its own because kiln.ops.integer imports kiln.ops.elementwise (through the
windowed helpers), while elementwise's records list these kernels.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..quant import integer_activations, integer_elementwise as elementwise
from ..schema import Activation
from .record import INT8, INT16, KernelCall


def params(call: KernelCall, i: int, what: str, *, per_tensor: bool = True):
    """Input ``i``'s (or, with i < 0, the output's) QuantParams, checked."""
    t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
    q = None if t is None else t.quantization
    if q is None or q.scale.size == 0:
        raise OpError(f"{call.op.name}: {what} {t.name if t is not None else ''!r} has no quantization "
                      "parameters")
    if per_tensor and q.scale.size != 1:
        raise OpError(f"{call.op.name}: {what} {t.name!r} is quantized per channel ({q.scale.size} "
                      "scales); this kernel takes one scale")
    return q


def out_params(call: KernelCall):
    return params(call, -1, "output")


def int16_zero_points(call: KernelCall, *indices: int) -> None:
    """16x8 kernels take symmetric int16 activations (LiteRT checks zero point 0)."""
    for i in indices:
        t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
        if t is not None and t.quantization is not None and np.any(t.quantization.zero_point):
            raise OpError(f"{call.op.name}: int16 tensor {t.name!r} has zero point "
                          f"{int(t.quantization.zero_point[0])}; 16x8 kernels need 0")


def fused_activation(call: KernelCall) -> Activation:
    return Activation(call.opts.fused_activation_function)


def _binary(fn):
    def kernel(call: KernelCall, a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        return fn(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"), out_params(call),
                  activation=fused_activation(call), out_dtype=call.out_dtypes[0])
    return kernel


ADD = dict.fromkeys((INT8, INT16), _binary(elementwise.add))
SUB = dict.fromkeys((INT8, INT16), _binary(elementwise.sub))
MUL = dict.fromkeys((INT8, INT16), _binary(elementwise.mul))
DIV = {INT8: _binary(elementwise.div)}


def _squared_difference(call: KernelCall, a, b):
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
    return elementwise.squared_difference(a, params(call, 0, "input 0"), b, params(call, 1, "input 1"),
                                          out_params(call), out_dtype=call.out_dtypes[0])


def _unary(fn):
    def kernel(call: KernelCall, x):
        return fn(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])
    return kernel


SQUARED_DIFFERENCE = {INT8: _squared_difference}
def _int16_unary(fn):
    """A 16x8 table kernel: int16 in and out (zero points 0, checked by ``fn``)."""
    def kernel(call: KernelCall, x):
        if call.out_dtypes[0] != np.int16:
            raise OpError(f"{call.op.name}: int16 input needs an int16 output, got {np.dtype(call.out_dtypes[0])}")
        return fn(x, params(call, 0, "input"), out_params(call))
    return kernel


def _abs(call: KernelCall, x):
    if x.dtype == np.int16:
        int16_zero_points(call, 0, -1)
    return integer_activations.abs_(x, params(call, 0, "input"), out_params(call), out_dtype=call.out_dtypes[0])


RSQRT = {INT8: _unary(integer_activations.rsqrt), INT16: _int16_unary(integer_activations.rsqrt_int16)}
EXP = {INT8: _unary(integer_activations.exp), INT16: _int16_unary(integer_activations.exp_int16)}
LOG = {INT8: _unary(integer_activations.log), INT16: _int16_unary(integer_activations.log_int16)}
ABS = {INT8: _abs, INT16: _abs}


def comparison(fn):
    """An int8 comparison's kernel: ``fn`` on LiteRT's rescaled values (`comparison_values`)."""
    def kernel(call: KernelCall, a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        return fn(*elementwise.comparison_values(a, params(call, 0, "input 0"), b, params(call, 1, "input 1")))
    return kernel
