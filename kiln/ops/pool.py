"""Op family: 2-D pooling (MAX_POOL_2D, AVERAGE_POOL_2D).

The records; their kernels are kiln.kernels.pool's family (float, and int8 / uint8 / 16x8
whose input and output share one quantization). Both fold the window taps in order over the
whole tensor (no Python loop per pixel); AVERAGE_POOL_2D divides by the in-bounds part of
each window, as LiteRT. MAX_POOL_2D's float kernel also takes integer tensors whose input and
output share one quantization (max commutes with it).
"""

from __future__ import annotations

from ..kernels import pool
from ..schema import Activation, DType, Padding
from .record import OpDef, OptionsSpec, family, input_dtype, output_dtype, takes
from .traits import same


def _pool_version(op) -> int:
    if input_dtype(op, 0) == DType.INT16 and output_dtype(op) == DType.INT16:
        return 3
    if input_dtype(op, 0) == DType.INT8:
        return 2
    return 1


_POOL_OPTIONS = OptionsSpec("Pool2DOptions", {
    "padding": Padding.SAME,
    "stride_w": 0,
    "stride_h": 0,
    "filter_width": 0,
    "filter_height": 0,
    "fused_activation_function": Activation.NONE,
})

MAX_POOL_2D = OpDef(
    name="MAX_POOL_2D", **family(pool.MAX_POOL_2D), options=_POOL_OPTIONS,
    version=_pool_version, max_version=3, shape=lambda opts, shapes: [pool.pool_shape(opts, shapes[0])],
    fused_activation_host=True, runtime_versions=("1.5.0", "1.14.0", "2.3.0"),
    quantization=same(), types=takes("float32 int8 uint8 int16"),
)
AVERAGE_POOL_2D = OpDef(
    name="AVERAGE_POOL_2D", **family(pool.AVERAGE_POOL_2D), options=_POOL_OPTIONS,
    version=_pool_version, max_version=3, shape=lambda opts, shapes: [pool.pool_shape(opts, shapes[0])],
    fused_activation_host=True, runtime_versions=("1.5.0", "1.14.0", "2.3.0"),
    quantization=same(), types=takes("float16 float32 int8 uint8 int16"),
)


OPS = (MAX_POOL_2D, AVERAGE_POOL_2D)
