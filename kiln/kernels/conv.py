"""Kernel families of the convolutions: CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV, per
number format (kiln.kernels.family): float, integer (int8, 16x8, legacy uint8) and hybrid.

Every format runs over an array namespace: im2col windows of the padded input
(kiln.kernels.windows) times the filter laid out once, or (depthwise) the taps' products
summed in order. The float formats are LiteRT's reference arithmetic in the reference kernels'
own order and BLAS layout, so the NumPy delegate, which runs the same ``run`` on planned
buffers, gives their bits; the integer ones are bit-exact with LiteRT 2.3's ``BUILTIN_REF``:
``Σ (x − zp_x) · w`` exact (padding adds nothing, as the reference skips those taps), the
bias, then the output stage — measured: two roundings for int8 (one differs on ~0.1 % of
outputs), the int64-accumulator rescaling for 16x8, GetQuantizedConvolutionMultipler for the
legacy uint8 kernels. The hybrid formats quantize each batch entry asymmetrically
(kiln.kernels.hybrid) and rescale in float32 in LiteRT's order (reference
HybridConvPerChannel, DepthwiseConvHybridPerChannel, HybridTransposeConv).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import OpError
from . import float_math
from .dense import HYBRID, INT8, INT16, UINT8, clamp_float, float_dot, hybrid_bias
from .family import (
    Format,
    as_float,
    finish_float,
    float_bias,
    float_dtype,
    float_range,
    fused_activation,
    int16_zero_points,
    known,
    nhwc,
    operand,
    out_params,
    params,
    reject_quantized,
    run_bias,
)
from .fixedpoint import (
    ExactProduct,
    Requantizer,
    activation_range,
    centred_max,
    centred,
    channel_multipliers,
    exact_type,
    uint8_multiplier,
)
from .hybrid import quantize_batches
from .windows import Window, kept, padded, scatter_add, transpose_conv_geometry, windows

F32 = np.float32
#: Element budget of one im2col matrix of a float convolution; larger ones run in chunks of
#: output rows (the same chunks on every NumPy path, so BLAS sums alike).
FLOAT_IM2COL_BUDGET = 1 << 24
#: The same for the integer and hybrid formats (exact sums: any chunks give the same bits).
IM2COL_BUDGET = 1 << 22
#: Element budget of a depthwise convolution's products buffer [KH*KW(+1), N, OH, OW, C]; larger
#: ones accumulate one tap at a time (the same sums in the same order).
DEPTHWISE_BUDGET = 1 << 20


def _zp(q) -> int:
    return int(q.zero_point[0])


@dataclass
class Conv:
    """What every convolution format prepares: geometry, output, activation range."""

    window: Window
    out_shape: tuple
    lo: float
    hi: float
    out_dtype: np.dtype
    workspace: dict = field(default_factory=dict, repr=False)   # NumPy buffers, kept with the plan


def _window(call, x_shape, w_shape, kernel_hw) -> Window:
    nhwc(call, x_shape)
    nhwc(call, w_shape, "filter")
    opts = call.opts
    return Window.of_2d(opts, x_shape[1:3], kernel_hw, (opts.dilation_h_factor, opts.dilation_w_factor))


def _rows_per_chunk(budget: int, n: int, window: Window, depth: int) -> int:
    oh, ow = window.out
    return max(1, budget // max(1, n * ow * depth))


def _im2col_product(xp, p, source, product, depth: int, budget: int, cols_dtype, out_dtype=np.int64):
    """[N*OH*OW, Cout] of the windows of ``source`` (a `Padded`) times ``product`` (a callable
    of a [rows, depth] matrix and, on NumPy, a buffer for its result or None; int64: an exact
    integer product), in chunks of output rows on NumPy, into buffers the plan keeps."""
    n = source.buf.shape[0]
    oh, ow = p.window.out
    windows = source.windows()
    if xp is not np:
        return product(windows.reshape(n * oh * ow, depth), None)
    cout = p.out_shape[-1]
    out = kept(p.workspace, "product", (n, oh, ow, cout), out_dtype)
    if p.window.pointwise:
        return product(source.buf.reshape(n * oh * ow, depth), out.reshape(n * oh * ow, cout))
    rows = min(oh, _rows_per_chunk(budget, n, p.window, depth))
    cols = kept(p.workspace, "cols", (n, rows, *windows.shape[2:]), cols_dtype)
    if rows >= oh:   # one product straight into the result
        np.copyto(cols, windows)
        return product(cols.reshape(n * oh * ow, depth), out.reshape(n * oh * ow, cout))
    for r0 in range(0, oh, rows):
        count = min(rows, oh - r0)
        chunk = cols[:, :count]
        np.copyto(chunk, windows[:, r0:r0 + count])
        out[:, r0:r0 + count] = product(chunk.reshape(n * count * ow, depth), None).reshape(n, count, ow, cout)
    return out.reshape(n * oh * ow, cout)


# -- CONV_2D ----------------------------------------------------------------------------------------

def conv_shape(opts, x, w) -> tuple[int, ...]:
    """CONV_2D's output shape (its record's shape rule), grouping checked."""
    if len(x) != 4 or len(w) != 4:
        raise OpError(f"CONV_2D: input {list(x)} and filter {list(w)} must both be 4-D")
    if w[3] == 0 or x[3] % w[3] or w[0] % (x[3] // w[3] or 1):
        raise OpError(f"CONV_2D: input channels {x[3]} and filter {list(w)} do not form groups")
    window = Window.of_2d(opts, x[1:3], w[1:3], (opts.dilation_h_factor, opts.dilation_w_factor))
    return (x[0], *window.out, w[0])


@dataclass
class FloatConv(Conv):
    dtype: np.dtype = None
    w_dtype: np.dtype = None
    groups: int = 1
    w_mat: np.ndarray | None = None     # the filter laid out (`_filter_matrix`), when prepare sees it
    bias: np.ndarray | None = None


def _filter_matrix(w, groups: int):
    """[KH*KW*Cg, Cout] (grouped: [G, KH*KW*Cg, Cout/G]): the reference's BLAS layout."""
    cout = w.shape[0]
    depth = int(np.prod(w.shape[1:]))
    return w.reshape(cout, depth).T if groups == 1 else w.reshape(groups, cout // groups, depth).transpose(0, 2, 1)


def prepare_float_conv(call, inputs) -> FloatConv:
    reject_quantized(call)
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    w_dtype = float_dtype(call, w, "filter")
    dtype = np.result_type(float_dtype(call, x, "input"), w_dtype)
    out_shape = conv_shape(call.opts, tuple(x.shape), tuple(w.shape))
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    groups = x.shape[3] // w.shape[3]
    w_mat = _filter_matrix(as_float(w, w_dtype), groups) if known(w) else None
    lo, hi = float_range(call.opts.fused_activation_function, dtype)
    return FloatConv(window, out_shape, lo, hi, call.out_dtypes[0], dtype=dtype, w_dtype=w_dtype, groups=groups,
                     w_mat=w_mat, bias=float_bias(call, bias, w.shape[0]))


def run_float_conv(xp, p: FloatConv, x, w=None, bias=None):
    """im2col: the windows of each chunk of output rows as one matrix, times the filter (a 1x1
    window: the input, strided, is the matrix)."""
    n, oh, ow, cout = p.out_shape
    x = as_float(x, p.dtype)
    w_mat = p.w_mat if p.w_mat is not None else _filter_matrix(as_float(w, p.w_dtype), p.groups)
    cin = x.shape[3]
    (kh, kw), (sh, sw) = p.window.kernel, p.window.strides
    if kh == kw == 1 and p.groups == 1:   # SAME padding of a 1x1 window is always zero
        taps = x if (sh, sw) == (1, 1) else windows(xp, x, p.window, taps=True)[0]
        out = kept(p.workspace, "product", (n * oh * ow, cout), x.dtype) if xp is np else None
        y = float_dot(xp, taps.reshape(-1, cin), w_mat, out)
    else:
        source = padded(xp, x, p.window, 0, x.dtype, p.workspace)
        product = (lambda cols, out: float_dot(xp, cols, w_mat, out)) if p.groups == 1 else \
            (lambda cols, out: _grouped(xp, p.groups, cols, kh * kw, w_mat))
        y = _im2col_product(xp, p, source, product, kh * kw * cin, FLOAT_IM2COL_BUDGET, x.dtype, x.dtype)
    return finish_float(xp, y.reshape(n, oh, ow, cout), run_bias(p.bias, bias), p.lo, p.hi, p.out_dtype)


def _grouped(xp, groups: int, cols, taps: int, w_mat):
    """A grouped convolution's [m, Cout]: each group's columns of the im2col matrix ``cols``
    [m, KH*KW*Cin] times its filters (one batched product)."""
    m = cols.shape[0]
    pat = cols.reshape(m, taps, groups, -1).transpose(2, 0, 1, 3).reshape(groups, m, -1)
    out = float_dot(xp, pat, w_mat)
    return out.transpose(1, 0, 2).reshape(m, -1)


@dataclass
class IntegerConv(Conv):
    zx: int = 0
    product: ExactProduct = None     # the centred filter [KH*KW*Cin, Cout]
    bias: np.ndarray | None = None
    requant: Requantizer = None


def _integer_output(call, x_dtype, w_qp, channels: int, bound: int) -> tuple:
    """(activation range, Requantizer) of an integer convolution's output stage."""
    x_qp, out_qp = params(call, 0 if call.op.op_type != "TRANSPOSE_CONV" else 2, "input"), out_params(call)
    uint8 = np.dtype(x_dtype) == np.uint8
    m, s = uint8_multiplier(x_qp, w_qp, out_qp) if uint8 else channel_multipliers(x_qp, w_qp, out_qp, channels)
    out_dtype = call.out_dtypes[0]
    lo, hi = activation_range(fused_activation(call), out_qp, out_dtype)
    kind = "int64" if np.dtype(x_dtype) == np.int16 else "double"
    return (lo, hi), Requantizer(kind, m, s, _zp(out_qp), lo, hi, out_dtype, bound)


def _integer_filter(call, x, w, channels: int, index: int = 1):
    """The filter less its zero point (uint8 filters have one, per tensor; int8 ones are
    symmetric: their kernels ignore it), its QuantParams, the input's zero point, the bias."""
    if not known(w):
        raise OpError(f"{call.op.name}: quantized filter and bias must be constants")
    uint8 = np.dtype(x.dtype) == np.uint8
    w_qp = params(call, index, "filter", per_tensor=uint8)
    return w.astype(np.int64) - (_zp(w_qp) if uint8 else 0), w_qp


def _integer_bias(call, bias, channels: int):
    if bias is None:
        return None
    if not known(bias):
        raise OpError(f"{call.op.name}: quantized filter and bias must be constants")
    return np.asarray(bias, np.int64).reshape(channels)


def prepare_integer_conv(call, inputs) -> IntegerConv:
    """int8 / 16x8 CONV_2D (reference ConvPerChannel, one group) and the legacy uint8 one."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    if np.dtype(x.dtype) == np.int16:
        int16_zero_points(call, 0, -1)
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    cout, kh, kw, cin = w.shape
    if x.shape[3] != cin:
        raise OpError(f"CONV_2D: input has {x.shape[3]} channels, the filter {cin} "
                      "(grouped convolution has no integer kernel here)")
    wc, w_qp = _integer_filter(call, x, w, cout)
    zx = _zp(params(call, 0, "input"))
    product = ExactProduct(wc.reshape(cout, -1).T, centred_max(x.dtype, zx))
    b = _integer_bias(call, bias, cout)
    (lo, hi), requant = _integer_output(call, x.dtype, w_qp, cout,
                                        product.bound + (0 if b is None else int(np.abs(b).max(initial=0))))
    return IntegerConv(window, (x.shape[0], *window.out, cout), lo, hi, call.out_dtypes[0], zx=zx, product=product,
                       bias=b, requant=requant)


def run_integer_conv(xp, p: IntegerConv, x):
    n, oh, ow, cout = p.out_shape
    dtype = p.product.type(xp)
    source = padded(xp, x, p.window, p.zx, dtype, p.workspace)
    acc = _im2col_product(xp, p, source, partial(p.product, xp), p.product.w.shape[0], IM2COL_BUDGET, dtype)
    if p.bias is not None:
        acc = np.add(acc, p.bias, out=acc) if xp is np else acc + p.bias
    return p.requant.requantize(xp, acc).reshape(n, oh, ow, cout)


@dataclass
class HybridConv(Conv):
    product: ExactProduct = None     # int8 filter [KH*KW*Cin, Cout] or, depthwise, [KH*KW, Cout]
    scales: np.ndarray = None
    bias: np.ndarray | None = None
    multiplier: int = 1


def _hybrid_filter(call, x, w, channels: int):
    if w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and int8 filter, got {x.dtype} "
                      f"and {w.dtype}")
    if not known(w):
        raise OpError(f"{call.op.name}: hybrid int8 weights must be constants")
    scales = np.asarray(params(call, 1, "filter", per_tensor=False).scale, F32)
    if scales.size != channels:
        raise OpError(f"{call.op.name}: hybrid kernel with per-tensor int8 weights is not supported "
                      "(TensorFlow writes per-channel ones)")
    return scales


def prepare_hybrid_conv(call, inputs) -> HybridConv:
    """Hybrid CONV_2D (reference HybridConvPerChannel): per-channel int8 filters, one group."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    scales = _hybrid_filter(call, x, w, w.shape[0])
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    if w.shape[3] != x.shape[3]:
        raise OpError(f"{call.op.name}: hybrid kernel needs filter channels {w.shape[3]} == input channels "
                      f"{x.shape[3]} (no grouped hybrid convolution)")
    cout = w.shape[0]
    lo, hi = float_range(call.opts.fused_activation_function, F32)
    return HybridConv(window, (x.shape[0], *window.out, cout), lo, hi, call.out_dtypes[0],
                      product=ExactProduct(w.reshape(cout, -1).T, 255), scales=scales,
                      bias=hybrid_bias(call, bias, cout))


def run_hybrid_conv(xp, p: HybridConv, x, w=None, bias=None):
    """``(float32(acc) · channel_scale) · input_scale + bias``, each step rounded to float32."""
    f = float_math.arithmetic(xp)
    n, oh, ow, cout = p.out_shape
    centred, scale = quantize_batches(xp, x.astype(F32))
    dtype = p.product.type(xp)
    source = padded(xp, centred, p.window, 0, dtype, p.workspace)
    acc = _im2col_product(xp, p, source, partial(p.product, xp), p.product.w.shape[0], IM2COL_BUDGET, dtype)
    out = f.mul(f.mul(acc.reshape(n, oh, ow, cout).astype(F32), p.scales), scale.reshape(-1, 1, 1, 1))
    return _hybrid_finish(xp, f, p, out, bias)


def _hybrid_finish(xp, f, p, out, bias):
    """A hybrid convolution's float32 bias, then its activation's clamp."""
    b = run_bias(p.bias, bias)
    if b is not None:
        out = f.add(out, b.astype(F32))
    return clamp_float(xp, out, p.lo, p.hi, p.out_dtype)


CONV_2D = {
    None: Format(prepare_float_conv, run_float_conv, (0, 1, 2)),
    **dict.fromkeys((INT8, INT16, UINT8), Format(prepare_integer_conv, run_integer_conv)),
    HYBRID: Format(prepare_hybrid_conv, run_hybrid_conv, (0, 1, 2)),
}


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------------

def depthwise_multiplier(x_shape, w_shape) -> int:
    """Output channels per input channel. LiteRT's builtin kernel takes it from the shapes and
    ignores the (redundant) depth_multiplier option, even when it disagrees."""
    cin, cout = x_shape[3], w_shape[3]
    if w_shape[0] != 1:
        raise OpError(f"DEPTHWISE_CONV_2D: filter must be [1, KH, KW, C*M], got {list(w_shape)}")
    if cin == 0 or cout % cin:
        raise OpError(f"DEPTHWISE_CONV_2D: filter channels {cout} are not a multiple of input channels {cin}")
    return cout // cin


def depthwise_shape(opts, x, w) -> tuple[int, ...]:
    """DEPTHWISE_CONV_2D's output shape (its record's shape rule), checked."""
    if len(x) != 4 or len(w) != 4:
        raise OpError(f"DEPTHWISE_CONV_2D: input {list(x)} and filter {list(w)} must be 4-D")
    depthwise_multiplier(x, w)
    window = Window.of_2d(opts, x[1:3], w[1:3], (opts.dilation_h_factor, opts.dilation_w_factor))
    return (x[0], *window.out, w[3])


def _tap_sum(xp, p, source, weights, dtype, bias=None):
    """Σ over the taps, in order, of each tap's window times its per-channel weights
    [KH*KW, Cout] — output channel ``c·m + k`` reads input channel ``c``. NumPy: every tap's
    products in one buffer and one reduction (its rows summed in order, then the bias as a
    last row); past `DEPTHWISE_BUDGET`, and on other namespaces, tap by tap: the same sums."""
    n, oh, ow, cout = p.out_shape
    mult = cout // source.buf.shape[3]
    k = p.window.taps
    rows = k + (bias is not None)
    if xp is np and rows * n * oh * ow * cout <= DEPTHWISE_BUDGET:
        plan = p.workspace.get("tap sum")
        if plan is None:   # the buffers and their views, made once (and a prepared bias written)
            products = np.empty((rows, n, oh, ow, cout), dtype)
            products[k:] = p.bias if bias is not None and bias is p.bias else 0
            plan = p.workspace["tap sum"] = (
                products, products[:k], products[:k].reshape(*p.window.kernel, n, oh, ow, cout // mult, mult),
                source.windows().transpose(3, 4, 0, 1, 2, 5)[..., None], np.empty((n, oh, ow, cout), dtype),
                weights, weights.reshape(k, 1, 1, 1, cout).astype(dtype))
        products, head, gathered, tap_major, total, cast_from, cast = plan
        np.copyto(gathered, tap_major)
        # integer weights (always the prepared constants) cast once: a casting multiply is 5x slower
        w = cast if weights is cast_from and weights.dtype != dtype else weights.reshape(k, 1, 1, 1, cout)
        np.multiply(head, w, out=head)
        if bias is not None and bias is not p.bias:
            products[k] = bias
        return np.add.reduce(products, axis=0, out=total)
    y = None
    for t, tap in enumerate(source.taps()):   # NumPy adds in place (``+=`` is ``+`` on an immutable array)
        term = (xp.repeat(tap, mult, axis=3) if mult > 1 else tap) * weights[t].astype(dtype)
        if y is None:
            y = term
        else:
            y += term
    return y if bias is None else y + bias.astype(dtype)


@dataclass
class FloatDepthwise(Conv):
    dtype: np.dtype = None
    w_dtype: np.dtype = None
    weights: np.ndarray | None = None       # [KH*KW, Cout], when prepare sees the filter
    bias: np.ndarray | None = None


def prepare_float_depthwise(call, inputs) -> FloatDepthwise:
    reject_quantized(call)
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    w_dtype = float_dtype(call, w, "filter")
    dtype = np.result_type(float_dtype(call, x, "input"), w_dtype)
    out_shape = depthwise_shape(call.opts, tuple(x.shape), tuple(w.shape))
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    cout = w.shape[3]
    weights = as_float(w, w_dtype).reshape(-1, cout) if known(w) else None
    lo, hi = float_range(call.opts.fused_activation_function, dtype)
    return FloatDepthwise(window, out_shape, lo, hi, call.out_dtypes[0], dtype=dtype, w_dtype=w_dtype,
                          weights=weights, bias=float_bias(call, bias, cout))


def run_float_depthwise(xp, p: FloatDepthwise, x, w=None, bias=None):
    """The filter taps accumulated in order over the whole tensor, then the bias."""
    weights = p.weights if p.weights is not None else as_float(w, p.w_dtype).reshape(-1, p.out_shape[3])
    source = padded(xp, as_float(x, p.dtype), p.window, 0, p.dtype, p.workspace)
    y = _tap_sum(xp, p, source, weights, p.dtype, run_bias(p.bias, bias))
    return finish_float(xp, y, None, p.lo, p.hi, p.out_dtype)


@dataclass
class IntegerDepthwise(Conv):
    zx: int = 0
    weights: np.ndarray = None       # the centred filter [KH*KW, Cout]
    bound: int = 0
    bias: np.ndarray | None = None
    requant: Requantizer = None


def prepare_integer_depthwise(call, inputs) -> IntegerDepthwise:
    """int8 / 16x8 DEPTHWISE_CONV_2D (reference DepthwiseConvPerChannel) and the legacy uint8 one."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    if np.dtype(x.dtype) == np.int16:
        int16_zero_points(call, 0, -1)
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    depthwise_multiplier(x.shape, w.shape)
    cout = w.shape[3]
    wc, w_qp = _integer_filter(call, x, w, cout)
    zx = _zp(params(call, 0, "input"))
    weights = wc.reshape(-1, cout)
    bound = centred_max(x.dtype, zx) * int(np.abs(weights).sum(axis=0).max(initial=0))
    b = _integer_bias(call, bias, cout)
    (lo, hi), requant = _integer_output(call, x.dtype, w_qp, cout, bound + (0 if b is None else int(np.abs(b).max())))
    return IntegerDepthwise(window, (x.shape[0], *window.out, cout), lo, hi, call.out_dtypes[0], zx=zx,
                            weights=weights, bound=bound, bias=b, requant=requant)


def run_integer_depthwise(xp, p: IntegerDepthwise, x):
    dtype = exact_type(xp, p.bound)
    source = padded(xp, x, p.window, p.zx, dtype, p.workspace)
    acc = _tap_sum(xp, p, source, p.weights, dtype).astype(xp.int64)
    if p.bias is not None:
        acc = np.add(acc, p.bias, out=acc) if xp is np else acc + p.bias
    return p.requant.requantize(xp, acc)


def prepare_hybrid_depthwise(call, inputs) -> HybridConv:
    """Hybrid DEPTHWISE_CONV_2D (reference DepthwiseConvHybridPerChannel): per-channel int8 filters."""
    x, w, bias = inputs[0], inputs[1], operand(inputs, 2)
    cout = w.shape[3] if w.ndim == 4 else 0
    scales = _hybrid_filter(call, x, w, cout)
    window = _window(call, x.shape, w.shape, w.shape[1:3])
    depthwise_multiplier(x.shape, w.shape)
    lo, hi = float_range(call.opts.fused_activation_function, F32)
    return HybridConv(window, (x.shape[0], *window.out, cout), lo, hi, call.out_dtypes[0],
                      product=ExactProduct(w.reshape(-1, cout), 255), scales=scales, bias=hybrid_bias(call, bias, cout))


def run_hybrid_depthwise(xp, p: HybridConv, x, w=None, bias=None):
    """``float32(acc) · (channel_scale · input_scale) + bias``."""
    f = float_math.arithmetic(xp)
    centred, scale = quantize_batches(xp, x.astype(F32))
    dtype = p.product.type(xp)
    source = padded(xp, centred, p.window, 0, dtype, p.workspace)
    acc = _tap_sum(xp, p, source, p.product.w, dtype)
    factor = f.mul(p.scales[None, :], scale[:, None])
    out = f.mul(acc.astype(xp.int64).astype(F32), factor[:, None, None, :])
    return _hybrid_finish(xp, f, p, out, bias)


DEPTHWISE_CONV_2D = {
    None: Format(prepare_float_depthwise, run_float_depthwise, (0, 1, 2)),
    **dict.fromkeys((INT8, INT16, UINT8), Format(prepare_integer_depthwise, run_integer_depthwise)),
    HYBRID: Format(prepare_hybrid_depthwise, run_hybrid_depthwise, (0, 1, 2)),
}


# -- TRANSPOSE_CONV (operands: output_shape, filter [Cout, KH, KW, Cin], input, bias) ------------------

@dataclass
class TransposeConv(Conv):
    crop: tuple = ()                 # (top, left) of the output in the uncropped one
    full_hw: tuple = ()
    dtype: np.dtype = None
    w_dtype: np.dtype = None
    w_mat: np.ndarray = None         # float: [Cin, KH*KW*Cout]
    product: ExactProduct = None     # integer: the filter [Cin, KH*KW*Cout]
    zx: int = 0
    scales: np.ndarray = None        # hybrid: per output channel
    bias: np.ndarray | None = None
    requant: Requantizer = None


def _transpose_geometry(call, inputs):
    shape, w, x = inputs[0], inputs[1], inputs[2]
    if not known(shape):
        raise OpError(f"{call.op.name}: output_shape must be known when the kernel prepares")
    nhwc(call, x.shape)
    nhwc(call, w.shape, "weights")
    (oh, ow), (pt, pl) = transpose_conv_geometry(call.opts, shape, x.shape, w.shape)
    n, h, wd, _ = x.shape
    cout, kh, kw, _ = w.shape
    sh, sw = call.opts.stride_h, call.opts.stride_w
    window = Window((kh, kw), (h, wd), ((0, 0), (0, 0)), (sh, sw), (1, 1))
    full_hw = (max((h - 1) * sh + kh, pt + oh), max((wd - 1) * sw + kw, pl + ow))
    return window, (n, oh, ow, cout), (pt, pl), full_hw


def _scattered(xp, p: TransposeConv, taps):
    """Each input pixel's taps [N, H, W, KH, KW, Cout] added, tap by tap in row-major order, into
    the zeroed uncropped output, then cropped."""
    n, oh, ow, cout = p.out_shape
    kh, kw = p.window.kernel
    full = xp.zeros((n, *p.full_hw, cout), taps.dtype)
    for i in range(kh):
        for j in range(kw):
            full = scatter_add(xp, full, taps[:, :, :, i, j], (i, j), p.window)
    (pt, pl) = p.crop
    return full[:, pt:pt + oh, pl:pl + ow]


def _taps_matrix(w):
    """[Cin, KH*KW*Cout]: every filter tap of every output channel, per input channel."""
    cout, kh, kw, cin = w.shape
    return w.transpose(1, 2, 0, 3).reshape(kh * kw * cout, cin).T


def prepare_float_transpose_conv(call, inputs) -> TransposeConv:
    reject_quantized(call)
    w, x, bias = inputs[1], inputs[2], operand(inputs, 3)
    w_dtype = float_dtype(call, w, "weights")
    dtype = np.result_type(float_dtype(call, x, "input"), w_dtype)
    window, out_shape, crop, full_hw = _transpose_geometry(call, inputs)
    lo, hi = float_range(call.opts.fused_activation_function, dtype)
    return TransposeConv(window, out_shape, lo, hi, call.out_dtypes[0], crop=crop, full_hw=full_hw, dtype=dtype,
                         w_dtype=w_dtype, w_mat=_taps_matrix(as_float(w, w_dtype)) if known(w) else None,
                         bias=float_bias(call, bias, w.shape[0]))


def run_float_transpose_conv(xp, p: TransposeConv, x, w=None, bias=None):
    """Scatter form: every input pixel adds filter · value into the (padded) output."""
    n, h, wd, cin = x.shape
    kh, kw = p.window.kernel
    w_mat = p.w_mat if p.w_mat is not None else _taps_matrix(as_float(w, p.w_dtype))
    cols = float_dot(xp, as_float(x, p.dtype).reshape(-1, cin), w_mat).reshape(n, h, wd, kh, kw, -1)
    y = _scattered(xp, p, cols)
    y = np.ascontiguousarray(y) if xp is np else y
    return finish_float(xp, y, run_bias(p.bias, bias), p.lo, p.hi, p.out_dtype)


def prepare_integer_transpose_conv(call, inputs) -> TransposeConv:
    """int8 / 16x8 TRANSPOSE_CONV (reference TransposeConv per channel)."""
    w, x, bias = inputs[1], inputs[2], operand(inputs, 3)
    if np.dtype(x.dtype) == np.int16:
        int16_zero_points(call, 2, -1)
    window, out_shape, crop, full_hw = _transpose_geometry(call, inputs)
    cout, kh, kw, cin = w.shape
    wc, w_qp = _integer_filter(call, x, w, cout)
    zx = _zp(params(call, 2, "input"))
    product = ExactProduct(wc.transpose(3, 1, 2, 0).reshape(cin, kh * kw * cout), centred_max(x.dtype, zx))
    bound = product.bound * kh * kw   # a tap's sums, and up to KH*KW taps land on one output
    b = _integer_bias(call, bias, cout)
    (lo, hi), requant = _integer_output(call, x.dtype, w_qp, cout, bound + (0 if b is None else int(np.abs(b).max())))
    return TransposeConv(window, out_shape, lo, hi, call.out_dtypes[0], crop=crop, full_hw=full_hw, product=product,
                         zx=zx, bias=b, requant=requant)


def run_integer_transpose_conv(xp, p: TransposeConv, x):
    n, h, wd, cin = x.shape
    kh, kw = p.window.kernel
    taps = p.product(xp, centred(xp, x, p.zx, p.product.type(xp)).reshape(-1, cin)).reshape(n, h, wd, kh, kw, -1)
    acc = _scattered(xp, p, taps)
    acc = acc + p.bias if p.bias is not None else (acc.copy() if xp is np else acc)
    return p.requant.requantize(xp, acc)


def prepare_hybrid_transpose_conv(call, inputs) -> TransposeConv:
    """Hybrid TRANSPOSE_CONV (reference HybridTransposeConv): int8 filter, one scale or one per
    output channel."""
    w, x, bias = inputs[1], inputs[2], operand(inputs, 3)
    if w.dtype != np.int8 or x.dtype != np.float32:
        raise OpError(f"{call.op.name}: hybrid kernel takes float32 input and int8 filter, got {x.dtype} "
                      f"and {w.dtype}")
    window, out_shape, crop, full_hw = _transpose_geometry(call, inputs)
    cout = w.shape[0]
    scales = np.asarray(params(call, 1, "filter", per_tensor=False).scale, F32).reshape(-1)
    if scales.size not in (1, cout):
        raise OpError(f"{call.op.name}: filter has {scales.size} scales for {cout} output channels")
    lo, hi = float_range(call.opts.fused_activation_function, F32)
    return TransposeConv(window, out_shape, lo, hi, call.out_dtypes[0], crop=crop, full_hw=full_hw,
                         w_mat=np.asarray(w, np.int64).transpose(1, 2, 3, 0),     # [KH, KW, Cin, Cout]
                         scales=np.ascontiguousarray(np.broadcast_to(scales, (cout,))), bias=hybrid_bias(call, bias, cout))


def run_hybrid_transpose_conv(xp, p: TransposeConv, x, w=None, bias=None):
    """Every input code less the zero point, times each int8 filter tap, is rescaled on its own
    — ``float32(acc) · channel_scale · input_scale``, two float32 roundings — and added in
    float32 to the output it lands on, in LiteRT's scatter order (input row, column, channel).
    For one output element, ascending input rows and columns are descending filter taps, so
    the taps go from the last to the first and, for each, the channels in order, each step one
    float32 addition over every input pixel (a tap maps distinct pixels to distinct outputs).
    Measured: one integer accumulator rescaled once misses by a few ulps on most outputs."""
    f = float_math.arithmetic(xp)
    n, oh, ow, cout = p.out_shape
    kh, kw = p.window.kernel
    centred, scale = quantize_batches(xp, x.astype(F32))
    batch_scale = scale.reshape(-1, 1, 1, 1)
    full = xp.zeros((n, *p.full_hw, cout), F32)
    for i in reversed(range(kh)):
        for j in reversed(range(kw)):
            for c in range(centred.shape[3]):
                term = f.mul(f.mul((centred[..., c:c + 1] * p.w_mat[i, j, c]).astype(F32), p.scales), batch_scale)
                full = scatter_add(xp, full, term, (i, j), p.window, f.add)
    (pt, pl) = p.crop
    out = full[:, pt:pt + oh, pl:pl + ow]
    return _hybrid_finish(xp, f, p, out if p.bias is not None or bias is not None or xp is not np else out.copy(), bias)


TRANSPOSE_CONV = {
    None: Format(prepare_float_transpose_conv, run_float_transpose_conv, (2, 1, 3)),
    **dict.fromkeys((INT8, INT16), Format(prepare_integer_transpose_conv, run_integer_transpose_conv, (2,))),
    HYBRID: Format(prepare_hybrid_transpose_conv, run_hybrid_transpose_conv, (2, 1, 3)),
}


__all__ = ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "conv_shape", "depthwise_shape"]
