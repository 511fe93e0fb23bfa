"""Op family: image ops (resizing, depth/space and batch/space rearrangements).

Resizing reproduces LiteRT's coordinate arithmetic in float32 (the scale, the half-pixel
shift, the floor/ceil neighbours and the weights of ``reference_ops::ResizeBilinear`` and
``GetNearestNeighbor``), since a one-ulp difference in a source coordinate can pick another
pixel. The rearrangements are reshape/transpose only, so they also run on quantized codes
when input and output share their quantization.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..schema import DType
from ..kernels import image as image_kernels
from ..kernels.family import float_dtype
from .record import (
    KernelCall,
    OpDef,
    OptionsSpec,
    input_dtype,
    input_rank,
    is_quantized,
    on_codes,
    reject_quantized,
    takes,
)
from .traits import INT8_ONLY, same

_F32 = np.float32


def output_tensor(call: KernelCall, i: int = 0):
    """The IR tensor of output ``i`` (None when the node has no such output)."""
    outs = call.op.outputs
    return outs[i] if i < len(outs) else None


def _nhwc(call: KernelCall, x: np.ndarray) -> np.ndarray:
    if x.ndim != 4:
        raise OpError(f"{call.op.name}: input must be 4-D NHWC, got shape {x.shape}")
    return x


def new_size(call: KernelCall, size) -> tuple[int, int]:
    size = np.asarray(size).reshape(-1)
    if size.size != 2 or size.dtype.kind not in "iu":
        raise OpError(f"{call.op.name}: size must be an integer [new_height, new_width], got {size}")
    h, w = int(size[0]), int(size[1])
    if h <= 0 or w <= 0:
        raise OpError(f"{call.op.name}: output size {h}x{w} must be positive")
    return h, w


def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    """Source pixels per output pixel, as LiteRT computes it (in float32)."""
    if align_corners and out_size > 1:
        return _F32(in_size - 1) / _F32(out_size - 1)
    return _F32(in_size) / _F32(out_size)


# -- RESIZE_BILINEAR ----------------------------------------------------------------------------

def bilinear_axis(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    """Per output index: lower and upper source index and the weight of the upper one."""
    scale = _scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=_F32)
    if half_pixel:
        src = (pos + _F32(0.5)) * scale - _F32(0.5)
    else:
        src = pos * scale
    lower = np.maximum(np.floor(src), 0).astype(np.intp)
    upper = np.minimum(np.ceil(src).astype(np.intp), in_size - 1)
    # LiteRT weighs with (src - lower) after clamping, so a negative src keeps full weight
    # on pixel 0 through lower == upper.
    frac = src - lower.astype(_F32)
    return lower, upper, frac


def _resize_bilinear_version(op) -> int:
    if input_dtype(op) == DType.INT16:
        return 4
    if op.options["half_pixel_centers"]:
        return 3
    if input_dtype(op) == DType.INT8:
        return 2
    return 1


def resize_bilinear(xp, call: KernelCall, x, size):
    """RESIZE_BILINEAR over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla, where
    ``size`` is static): float inputs, computed in float32."""
    x = _nhwc(call, x)
    float_dtype(call, x, "input")
    opts = call.opts
    oh, ow = new_size(call, size)
    ac, hp = bool(opts.align_corners), bool(opts.half_pixel_centers)
    if ac and hp:
        raise OpError("RESIZE_BILINEAR: if half_pixel_centers is True, align_corners must be False")
    y0, y1, dy = bilinear_axis(x.shape[1], oh, ac, hp)
    x0, x1, dx = bilinear_axis(x.shape[2], ow, ac, hp)
    xf = xp.asarray(x, _F32)
    top, bottom = xf[:, y0], xf[:, y1]
    dy = dy[None, :, None, None]
    dx = dx[None, None, :, None]
    one = _F32(1)
    out = (top[:, :, x0] * (one - dy) * (one - dx)
           + bottom[:, :, x0] * dy * (one - dx)
           + top[:, :, x1] * (one - dy) * dx
           + bottom[:, :, x1] * dy * dx)
    return xp.asarray(out, call.out_dtypes[0])


def _resize_bilinear_kernel(call: KernelCall, x, size):
    reject_quantized(call)
    return resize_bilinear(np, call, x, size)


RESIZE_BILINEAR = OpDef(
    name="RESIZE_BILINEAR",
    kernel=_resize_bilinear_kernel,
    options=OptionsSpec("ResizeBilinearOptions", {
        "align_corners": False,
        "half_pixel_centers": False,
    }),
    version=_resize_bilinear_version,
    max_version=4,
    quantized=image_kernels.RESIZE_BILINEAR,
    runtime_versions=("1.7.0", "1.14.0", "2.2.0", "2.5.0"),
    quantization=same(),
    types=takes("float32 int8 uint8 int16"),
)


# -- RESIZE_NEAREST_NEIGHBOR --------------------------------------------------------------------

def _round_half_away(v: np.ndarray) -> np.ndarray:
    """std::round for non-negative floats, without the float error of floor(v + 0.5)."""
    r = np.floor(v)
    return r + (v - r >= _F32(0.5))


def nearest_axis(in_size: int, out_size: int, align_corners: bool, half_pixel: bool):
    scale = _scale(in_size, out_size, align_corners)
    offset = _F32(0.5) if half_pixel else _F32(0)
    src = (np.arange(out_size, dtype=_F32) + offset) * scale
    idx = _round_half_away(src) if align_corners else np.floor(src)
    idx = np.minimum(idx.astype(np.intp), in_size - 1)
    return np.maximum(idx, 0) if half_pixel else idx


def _resize_nearest_version(op) -> int:
    if input_dtype(op) == DType.INT16:
        return 4
    if op.options["half_pixel_centers"] or op.options["align_corners"]:
        return 3
    if input_dtype(op) == DType.INT8:
        return 2
    return 1


def resize_nearest(xp, call: KernelCall, x, size):
    """RESIZE_NEAREST_NEIGHBOR over array namespace ``xp`` (``size`` static in kiln.xla)."""
    x = _nhwc(call, x)
    opts = call.opts
    oh, ow = new_size(call, size)
    ac, hp = bool(opts.align_corners), bool(opts.half_pixel_centers)
    rows = nearest_axis(x.shape[1], oh, ac, hp)
    cols = nearest_axis(x.shape[2], ow, ac, hp)
    return xp.asarray(xp.asarray(x)[:, rows][:, :, cols], call.out_dtypes[0])


def _resize_nearest_kernel(call: KernelCall, x, size):
    reject_quantized(call, shared_ok=True)
    return resize_nearest(np, call, x, size)


RESIZE_NEAREST_NEIGHBOR = OpDef(
    name="RESIZE_NEAREST_NEIGHBOR",
    kernel=_resize_nearest_kernel,
    quantized=on_codes(_resize_nearest_kernel),
    options=OptionsSpec("ResizeNearestNeighborOptions", {
        "align_corners": False,
        "half_pixel_centers": False,
    }),
    version=_resize_nearest_version,
    max_version=4,
    runtime_versions=("1.13.1", "1.14.0", "2.3.0", "2.4.0"),
    quantization=same(),
    types=takes("float16 float32 int8 uint8 int16 uint16 int32"),
)


# -- DEPTH_TO_SPACE / SPACE_TO_DEPTH ----------------------------------------------------------------

def _int8_version(op) -> int:
    return 2 if input_dtype(op) == DType.INT8 else 1


def _block(name: str, opts) -> int:
    b = int(opts.block_size)
    if b <= 0:
        raise OpError(f"{name}: block_size must be positive, got {b}")
    return b


def _depth_to_space_shape(opts, shapes):
    (n, h, w, c) = _four(shapes[0], "DEPTH_TO_SPACE")
    b = _block("DEPTH_TO_SPACE", opts)
    if c % (b * b):
        raise OpError(f"DEPTH_TO_SPACE: depth {c} is not a multiple of block_size^2 = {b * b}")
    return [(n, h * b, w * b, c // (b * b))]


def _space_to_depth_shape(opts, shapes):
    (n, h, w, c) = _four(shapes[0], "SPACE_TO_DEPTH")
    b = _block("SPACE_TO_DEPTH", opts)
    if h % b or w % b:
        raise OpError(f"SPACE_TO_DEPTH: height {h} and width {w} must be multiples of block_size {b}")
    return [(n, h // b, w // b, c * b * b)]


def _four(shape, name: str):
    if len(shape) != 4:
        raise OpError(f"{name}: input must be 4-D NHWC, got shape {list(shape)}")
    return tuple(shape)


def _depth_to_space_kernel(call: KernelCall, x):
    reject_quantized(call, shared_ok=True)
    (out_shape,) = _depth_to_space_shape(call.opts, [x.shape])
    n, h, w, c = x.shape
    b = call.opts.block_size
    y = x.reshape(n, h, w, b, b, c // (b * b)).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(out_shape).astype(call.out_dtypes[0], copy=False)


def _space_to_depth_kernel(call: KernelCall, x):
    reject_quantized(call, shared_ok=True)
    (out_shape,) = _space_to_depth_shape(call.opts, [x.shape])
    n, h, w, c = x.shape
    b = call.opts.block_size
    y = x.reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(out_shape).astype(call.out_dtypes[0], copy=False)


def _block_rearrangement(name: str, kernel, shape, options: str, runtime_versions: tuple[str, ...],
                         types: str = "float32 int8 uint8 int32 int64") -> OpDef:
    """DEPTH_TO_SPACE / SPACE_TO_DEPTH: values moved between depth and blocks of space, so the
    int8 op runs the kernel on the codes (version 2)."""
    return OpDef(name=name, kernel=kernel, quantized=on_codes(kernel), options=OptionsSpec(options, {"block_size": 0}),
                 version=_int8_version, max_version=2, shape=shape, runtime_versions=runtime_versions,
                 quantization=same(types=INT8_ONLY), types=takes(types))


DEPTH_TO_SPACE = _block_rearrangement("DEPTH_TO_SPACE", _depth_to_space_kernel, _depth_to_space_shape,
                                      "DepthToSpaceOptions", ("2.1.0", "2.5.0"),
                                      "float16 float32 int8 uint8 int32 int64")
SPACE_TO_DEPTH = _block_rearrangement("SPACE_TO_DEPTH", _space_to_depth_kernel, _space_to_depth_shape,
                                      "SpaceToDepthOptions", ("1.5.0", "1.14.0"))


# -- SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND ------------------------------------------------------------

def _batch_space_version(op) -> int:
    if input_dtype(op) == DType.INT16:
        return 4
    if input_rank(op) != 4:
        return 3
    if input_dtype(op) == DType.INT8:
        return 2
    return 1


def _block_and_pairs(call: KernelCall, x, block, pairs, what: str):
    block = np.asarray(block).reshape(-1).astype(np.int64)
    m = block.size
    pairs = np.asarray(pairs).astype(np.int64)
    if m < 1 or x.ndim < m + 1:
        raise OpError(f"{call.op.name}: block_shape {block.tolist()} does not fit input shape "
                      f"{list(x.shape)}")
    if pairs.shape != (m, 2):
        raise OpError(f"{call.op.name}: {what} must have shape [{m}, 2], got {list(pairs.shape)}")
    if (block < 1).any() or (pairs < 0).any():
        raise OpError(f"{call.op.name}: block_shape {block.tolist()} must be positive and {what} "
                      f"{pairs.tolist()} non-negative")
    return [int(v) for v in block], [(int(a), int(b)) for a, b in pairs]


def _space_to_batch_kernel(call: KernelCall, x, block_shape, paddings):
    """Pad, then move each block offset of the spatial dims into the batch (TF semantics)."""
    reject_quantized(call, shared_ok=True)
    block, pads = _block_and_pairs(call, x, block_shape, paddings, "paddings")
    m = len(block)
    out = output_tensor(call)
    q = out.quantization if is_quantized(out) else None
    fill = int(q.zero_point[0]) if q is not None else 0
    widths = [(0, 0), *pads] + [(0, 0)] * (x.ndim - 1 - m)
    xp = np.pad(x, widths, constant_values=fill) if any(a or b for a, b in pads) else x
    n, spatial, rest = xp.shape[0], xp.shape[1:m + 1], xp.shape[m + 1:]
    for size, b in zip(spatial, block):
        if size % b:
            raise OpError(f"SPACE_TO_BATCH_ND: padded spatial shape {list(spatial)} is not "
                          f"divisible by block_shape {block}")
    split = [n]
    for size, b in zip(spatial, block):
        split += [size // b, b]
    y = xp.reshape(*split, *rest)
    block_axes = [2 + 2 * i for i in range(m)]
    grid_axes = [1 + 2 * i for i in range(m)]
    tail = list(range(1 + 2 * m, y.ndim))
    y = y.transpose(*block_axes, 0, *grid_axes, *tail)
    out_shape = (n * int(np.prod(block)), *(s // b for s, b in zip(spatial, block)), *rest)
    return y.reshape(out_shape).astype(call.out_dtypes[0], copy=False)


def _batch_to_space_kernel(call: KernelCall, x, block_shape, crops):
    """Move block offsets from the batch back into the spatial dims, then crop."""
    reject_quantized(call, shared_ok=True)
    block, crop = _block_and_pairs(call, x, block_shape, crops, "crops")
    m = len(block)
    nb = int(np.prod(block))
    if x.shape[0] % nb:
        raise OpError(f"BATCH_TO_SPACE_ND: batch {x.shape[0]} is not divisible by the block "
                      f"size product {nb}")
    n, spatial, rest = x.shape[0] // nb, x.shape[1:m + 1], x.shape[m + 1:]
    y = x.reshape(*block, n, *spatial, *rest)
    order = [m]
    for i in range(m):
        order += [m + 1 + i, i]
    order += list(range(2 * m + 1, y.ndim))
    y = y.transpose(order).reshape(n, *(s * b for s, b in zip(spatial, block)), *rest)
    index = [slice(None)]
    for (a, b), size in zip(crop, y.shape[1:m + 1]):
        if a + b > size:
            raise OpError(f"BATCH_TO_SPACE_ND: crops {crop} exceed the spatial extent {size}")
        index.append(slice(a, size - b))
    return np.ascontiguousarray(y[tuple(index)]).astype(call.out_dtypes[0], copy=False)


def _batch_space_record(name: str, kernel) -> OpDef:
    """SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND: the same versions and number formats (LiteRT
    2.3 runs both with int8 and int16 activations, measured on BUILTIN_REF)."""
    return OpDef(name=name, kernel=kernel, quantized=on_codes(kernel), options=None, version=_batch_space_version,
                 max_version=4, runtime_versions=("1.6.0", "1.14.0", "2.3.0", "2.12.0"), quantization=same())


SPACE_TO_BATCH_ND = _batch_space_record("SPACE_TO_BATCH_ND", _space_to_batch_kernel)
BATCH_TO_SPACE_ND = _batch_space_record("BATCH_TO_SPACE_ND", _batch_to_space_kernel)


OPS = (
    RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR, DEPTH_TO_SPACE, SPACE_TO_DEPTH, SPACE_TO_BATCH_ND,
    BATCH_TO_SPACE_ND,
)
