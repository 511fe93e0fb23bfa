"""Lowerings of the NN ops without a kernel family (kiln/ops/conv3d.py, local response
normalization, image.py's resizes): 3-D convolutions as lax.conv_general_dilated with LiteRT's
padding split (the 2-D weighted and windowed ops run their kernel families: lower_families.py;
the resizes are their reference arithmetic over jax.numpy).

Geometry (output sizes, SAME padding before/after) comes from the reference kernels' own
helpers, evaluated on static shapes while tracing, so it cannot drift from them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import OpError
from ..kernels.windows import out_size
from ..ops.conv3d import geometry, window_params
from ..ops.image import resize_bilinear, resize_nearest
from ..ops.misc import local_response_normalization
from .lowering import Rows, fused_range, is_float, on_jnp

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def _float(call, x, what: str):
    if not is_float(x.dtype):
        raise OpError(f"{call.op.name}: {what} of type {x.dtype} is not supported (float only)")
    x = jnp.asarray(x)
    return x if x.dtype in (jnp.float64, jnp.bfloat16) else x.astype(jnp.float32)


def _finish(call, y, bias, act):
    """Bias over the channel axis, then the fused activation's clamp (to +-FLT_MAX for NONE)."""
    if bias is not None:
        b = _float(call, bias, "bias").reshape(-1)
        if b.size != y.shape[-1]:
            raise OpError(f"{call.op.name}: bias has {b.size} elements for {y.shape[-1]} output channels")
        y = y + b
    lo, hi = fused_range(act, np.dtype(y.dtype))
    return jnp.clip(y, jnp.asarray(lo, y.dtype), jnp.asarray(hi, y.dtype))


def conv_transpose(x, w, rhs_spec: str, strides, dilations, pads_before, out_spatial, *, acc_type=None):
    """The reference kernels' scatter form (every input element adds filter * value into the
    output, shifted by the forward convolution's leading padding) as one convolution of the
    stride-dilated input with the spatially flipped filter, padded or cropped to the output.
    ``acc_type`` (the quantized lowerings): operands already of that type, summed exactly in it."""
    rank = len(strides)
    kernel = [w.shape[rhs_spec.index(c)] for c in rhs_spec if c not in "OI"]
    flip = tuple(slice(None, None, -1) if c not in "OI" else slice(None) for c in rhs_spec)
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]
    lhs_spec = "N" + rhs_spec.replace("O", "").replace("I", "") + "C"
    full = lax.conv_general_dilated(x, w[flip], (1,) * rank, [(r, r) for r in reach], lhs_dilation=strides,
                                    rhs_dilation=dilations, dimension_numbers=(lhs_spec, rhs_spec, lhs_spec),
                                    precision=lax.Precision.HIGHEST if acc_type is None else None,
                                    preferred_element_type=acc_type)
    grow = [max(0, p + o - f) for p, o, f in zip(pads_before, out_spatial, full.shape[1:-1])]
    if any(grow):
        full = jnp.pad(full, [(0, 0), *[(0, g) for g in grow], (0, 0)])
    index = (slice(None), *[slice(p, p + o) for p, o in zip(pads_before, out_spatial)], slice(None))
    return full[index]


def _conv3d_geometry(call, sizes, kernel):
    """The reference kernel's checked strides and dilations, and its pads per spatial axis."""
    strides, dilations = window_params(call)
    return strides, dilations, geometry(call, sizes, kernel, strides, dilations)[1]


def _conv3d(call, x, w, bias=None):
    x, w = _float(call, x, "input"), _float(call, w, "filter")
    if x.ndim != 5 or w.ndim != 5:
        raise OpError(f"CONV_3D: input {list(x.shape)} and filter {list(w.shape)} must be 5-D")
    if w.shape[3] != x.shape[4]:
        raise OpError(f"CONV_3D: filter {list(w.shape)} [KD, KH, KW, Cin, Cout] expects {w.shape[3]} input "
                      f"channels, the input {list(x.shape)} has {x.shape[4]}")
    strides, dilations, pads = _conv3d_geometry(call, x.shape[1:4], w.shape[:3])
    y = lax.conv_general_dilated(x, w, strides, pads, rhs_dilation=dilations,
                                 dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
                                 precision=lax.Precision.HIGHEST)
    return _finish(call, y, bias, call.opts.fused_activation_function)


def _conv3d_transpose(call, output_shape, w, x, bias=None):
    shape = np.asarray(output_shape)
    if shape.dtype != np.int32 or shape.shape != (5,) or shape.min() < 0:
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape must be an int32 vector of 5 non-negative dims, "
                      f"got {shape.dtype} {shape.tolist()}")
    dims = [int(v) for v in shape]
    x, w = _float(call, x, "input"), _float(call, w, "filter")
    if x.ndim != 5 or w.ndim != 5:
        raise OpError(f"CONV_3D_TRANSPOSE: input {list(x.shape)} and filter {list(w.shape)} must be 5-D")
    kd, kh, kw, cout, wcin = w.shape
    if wcin != x.shape[4] or dims[0] != x.shape[0] or dims[4] != cout:
        raise OpError(f"CONV_3D_TRANSPOSE: input {list(x.shape)}, filter {list(w.shape)} [KD, KH, KW, Cout, Cin] "
                      f"and output_shape {dims} disagree")
    out_sp = tuple(dims[1:4])
    strides, dilations, pads = _conv3d_geometry(call, out_sp, (kd, kh, kw))
    fwd = tuple(out_size(call.opts.padding, o, k, s, d)
                for o, k, s, d in zip(out_sp, (kd, kh, kw), strides, dilations))
    if fwd != tuple(x.shape[1:4]):
        raise OpError(f"CONV_3D_TRANSPOSE: output_shape {dims} convolved with filter {[kd, kh, kw]} gives "
                      f"spatial extents {list(fwd)}, not the input's {list(x.shape[1:4])}")
    y = conv_transpose(x, w, "DHWOI", strides, dilations, [p[0] for p in pads], out_sp)
    return _finish(call, y, bias, call.opts.fused_activation_function)


def _channel_window_sums(squares, radius: int):
    window, padding = (1, 1, 1, 2 * radius + 1), ((0, 0),) * 3 + ((radius, radius),)
    return lax.reduce_window(squares, 0.0, lax.add, window, (1, 1, 1, 1), padding)


ROWS.add("CONV_3D", _conv3d)
ROWS.add("CONV_3D_TRANSPOSE", _conv3d_transpose, static=(0,))
ROWS.add("LOCAL_RESPONSE_NORMALIZATION", on_jnp(local_response_normalization, window_sums=_channel_window_sums))
ROWS.add("RESIZE_BILINEAR", on_jnp(resize_bilinear), static=(1,))
ROWS.add("RESIZE_NEAREST_NEIGHBOR", on_jnp(resize_nearest), static=(1,))
