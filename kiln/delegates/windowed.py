"""The compiled delegate's windowed lowerings: convolutions, depthwise convolutions, pooling.

Each keeps a persistent padded copy of its input with window views over it (`_Im2col`) and
does its reference kernel's arithmetic (kiln/ops/nn.py, kiln/ops/pool.py) in the same order
and weight layout, so BLAS and the ufuncs see the same operands and the outputs are the
reference kernels', bit for bit. Geometry is kiln.ops.windowed's, the one copy.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..ops.elementwise import activation_range
from ..ops.pool import window_counts
from ..ops.windowed import window_geometry, window_views
from .compiled import _Node, clamp

F32 = np.dtype(np.float32)
#: Element budget of one im2col matrix; bigger convolutions run in chunks of output rows
#: (the reference kernel's budget, so the chunks, and the sums, are the same).
IM2COL_BUDGET = 1 << 24


class _Im2col:
    """A persistent padded copy of the input (border ``fill``, zero by default) and window
    views over it.

    ``load(x)`` copies x into the padded interior; ``gather(r0)`` copies the windows of output
    rows [r0, r0 + rows) into a persistent column matrix (``chunk_rows`` 0: no matrix).
    """

    def __init__(self, x_shape, khw, out_hw, pads, strides, dilation, chunk_rows, fill=0.0):
        n, h, w, c = x_shape
        (kh, kw), (oh, ow) = khw, out_hw
        (pt, pb), (pl, pr) = pads
        self.padded = np.full((n, h + pt + pb, w + pl + pr, c), fill, F32)
        self.interior = self.padded[:, pt:pt + h, pl:pl + w, :]
        #: Pixel-major [N, OH, OW, KH, KW, C] and tap-major [KH, KW, N, OH, OW, C] windows.
        self.windows, self.taps = window_views(self.padded, khw, out_hw, strides, dilation)
        self.rows = chunk_rows
        self.cols = np.empty((n, chunk_rows, ow, kh, kw, c), F32)
        self.n, self.oh, self.ow, self.k, self.c = n, oh, ow, kh * kw, c

    def load(self, x):
        np.copyto(self.interior, x)

    def gather(self, r0: int) -> np.ndarray:
        """Column matrix [n * rows * ow, kh * kw, c] of output rows r0.. (a view of a buffer)."""
        rows = min(self.rows, self.oh - r0)
        cols = self.cols[:, :rows]
        np.copyto(cols, self.windows[:, r0:r0 + rows])
        return cols.reshape(self.n * rows * self.ow, self.k, self.c)


def _conv_setup(node: "_Node", w_khw):
    x_shape = node.in_shapes[0]
    if len(x_shape) != 4:
        raise node.error(f"input must be 4-D NHWC, got {list(x_shape)}")
    dil = (node.opts.dilation_h_factor, node.opts.dilation_w_factor)
    try:
        (oh, ow), pads = window_geometry(node.opts, x_shape[1:3], w_khw, dil)
    except OpError as exc:
        raise node.error(str(exc)) from None
    return x_shape, dil, (oh, ow), pads


def _bias_and_activation(node: "_Node", cout: int):
    """A convolution's constant bias as float32 [cout] (None without one) and its fused
    activation as an in-place clamp."""
    bias = node.consts[2] if len(node.consts) > 2 else None
    bias = None if bias is None else np.asarray(bias, F32).reshape(cout)
    return bias, clamp(*activation_range(node.opts.fused_activation_function, F32))


def _chunk_rows(n, ow, oh, per_pixel) -> int:
    return max(1, min(oh, IM2COL_BUDGET // max(1, n * ow * per_pixel)))


def lower_conv(node: "_Node"):
    w = np.asarray(node.consts[1], F32)
    cout, kh, kw, cin = w.shape
    x_shape, dil, (oh, ow), pads = _conv_setup(node, (kh, kw))
    n = x_shape[0]
    if x_shape[3] != cin:
        raise node.error(f"input channels {x_shape[3]} != filter channels {cin}")
    bias, clamp_y = _bias_and_activation(node, cout)
    out_shape = (n, oh, ow, cout)
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    strides = (node.opts.stride_h, node.opts.stride_w)
    w_mat = w.reshape(cout, kh * kw * cin).T  # the reference kernel's layout (same BLAS order)

    if kh == kw == 1 and pads == ((0, 0), (0, 0)):
        sh, sw = strides
        rows = n * oh * ow
        if sh == sw == 1 and not node.fresh[0]:  # the common case, with every view made once
            y = np.empty(out_shape, F32)
            y2 = y.reshape(rows, cout)
            x2_shape = (rows, cin)

            def run(slots):
                np.dot(slots[xi].reshape(x2_shape), w_mat, out=y2)
                if bias is not None:
                    np.add(y2, bias, out=y2)
                clamp_y(y2)
                slots[oi] = y
            return run, [out_shape]

        def run(slots):
            x = slots[xi]
            if sh != 1 or sw != 1:
                x = x[:, ::sh, ::sw, :][:, :oh, :ow]
            y = get()
            np.dot(x.reshape(-1, cin), w_mat, out=y.reshape(-1, cout))
            if bias is not None:
                y += bias
            clamp_y(y)
            slots[oi] = y
        return run, [out_shape]

    depth = kh * kw * cin
    rows = _chunk_rows(n, ow, oh, depth)
    im = _Im2col(x_shape, (kh, kw), (oh, ow), pads, strides, dil, rows)

    def run(slots):
        im.load(slots[xi])
        y = get()
        if rows >= oh:  # one GEMM straight into the output buffer
            cols = im.gather(0)
            np.dot(cols.reshape(len(cols), depth), w_mat, out=y.reshape(-1, cout))
        else:
            for r0 in range(0, oh, rows):
                cols = im.gather(r0)
                y[:, r0:r0 + rows] = (cols.reshape(len(cols), depth) @ w_mat).reshape(n, -1, ow, cout)
        if bias is not None:
            y += bias
        clamp_y(y)
        slots[oi] = y

    return run, [out_shape]


#: Element budget of a depthwise partial-products buffer [KH*KW + 1, N, OH, OW, C].
DEPTHWISE_BUDGET = 1 << 20


def lower_depthwise(node: "_Node"):
    w = np.asarray(node.consts[1], F32)
    _, kh, kw, cout = w.shape
    x_shape, dil, (oh, ow), pads = _conv_setup(node, (kh, kw))
    n, cin = x_shape[0], x_shape[3]
    if w.shape[0] != 1 or cin == 0 or cout % cin:
        raise node.error(f"filter {list(w.shape)} does not fit {cin} input channels")
    mult = cout // cin
    bias, clamp_y = _bias_and_activation(node, cout)
    out_shape = (n, oh, ow, cout)
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    strides = (node.opts.stride_h, node.opts.stride_w)
    k = kh * kw
    if mult == 1 and (k + 1) * n * oh * ow * cout <= DEPTHWISE_BUDGET:
        return _depthwise_rows(node, w, bias, clamp_y, out_shape, pads, strides, dil), [out_shape]
    # The reference kernel's tap loop (same order, so the same result) over a persistent
    # padded input, writing into planned buffers.
    im = _Im2col(x_shape, (kh, kw), (oh, ow), pads, strides, dil, 1)
    weights = w.reshape(kh, kw, cout)
    taps = [(im.taps[i, j], weights[i, j]) for i in range(kh) for j in range(kw)]
    scratch = np.empty(out_shape, F32)

    def run(slots):
        im.load(slots[xi])
        y = get()
        for t, (view, weight) in enumerate(taps):
            if mult > 1:  # output channel c * mult + m reads input channel c
                view = np.repeat(view, mult, axis=3)
            if t == 0:
                np.multiply(view, weight, out=y)
            else:
                np.add(y, np.multiply(view, weight, out=scratch), out=y)
        if bias is not None:
            np.add(y, bias, out=y)
        clamp_y(y)
        slots[oi] = y

    return run, [out_shape]


def _depthwise_rows(node: "_Node", w, bias, clamp_y, out_shape, pads, strides, dil):
    """Depthwise without a channel multiplier: all taps' products in one buffer, then one sum.

    Rows 0..K-1 of the buffer receive each tap's window times its weights; row K holds the
    bias, written once. Summing over the rows adds them one after the other, so the result
    is the reference kernel's: taps in order, then the bias.
    """
    n, oh, ow, c = out_shape
    _, kh, kw, _ = w.shape
    k = kh * kw
    im = _Im2col(node.in_shapes[0], (kh, kw), (oh, ow), pads, strides, dil, 1)
    rows = np.zeros((k + (bias is not None), n, oh, ow, c), F32)
    products = rows[:k]
    gathered = products.reshape(kh, kw, n, oh, ow, c)
    weights = np.ascontiguousarray(np.broadcast_to(w.reshape(k, 1, 1, 1, c), products.shape))
    if bias is not None:
        rows[k] = bias
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    taps = im.taps

    def run(slots):
        im.load(slots[xi])
        np.copyto(gathered, taps)
        np.multiply(products, weights, out=products)
        y = get()
        np.add.reduce(rows, axis=0, out=y)
        clamp_y(y)
        slots[oi] = y

    return run


def _pool_setup(node: "_Node", fill: float):
    """Geometry and a persistent ``fill``-padded input of a pooling node: (out_shape, _Im2col)."""
    opts = node.opts
    khw = (opts.filter_height, opts.filter_width)
    if khw[0] <= 0 or khw[1] <= 0:
        raise node.error(f"filter size {khw[0]}x{khw[1]} must be positive")
    x_shape = node.in_shapes[0]
    if len(x_shape) != 4:
        raise node.error(f"input must be 4-D NHWC, got {list(x_shape)}")
    try:
        out_hw, pads = window_geometry(opts, x_shape[1:3], khw)
    except OpError as exc:
        raise node.error(str(exc)) from None
    im = _Im2col(x_shape, khw, out_hw, pads, (opts.stride_h, opts.stride_w), (1, 1), 0, fill)
    return (x_shape[0], *out_hw, x_shape[3]), im, pads


def lower_max_pool(node: "_Node"):
    """MAX_POOL_2D: taps maxed in order over a persistent -inf-padded copy (as the kernel)."""
    out_shape, im, _ = _pool_setup(node, -np.inf)
    taps = im.taps
    kh, kw = taps.shape[:2]
    rest = [taps[i, j] for i in range(kh) for j in range(kw)][1:]
    first = taps[0, 0]
    clamp_y = clamp(*activation_range(node.opts.fused_activation_function, F32))
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        im.load(slots[xi])
        y = get()
        np.copyto(y, first)
        for tap in rest:
            np.maximum(y, tap, out=y)
        clamp_y(y)
        slots[oi] = y

    return run, [out_shape]


def lower_avg_pool(node: "_Node"):
    """AVERAGE_POOL_2D: taps summed in order from zero, divided by each window's in-bounds
    pixel count (worked out once), as the kernel."""
    out_shape, im, pads = _pool_setup(node, 0.0)
    taps = im.taps
    kh, kw = taps.shape[:2]
    all_taps = [taps[i, j] for i in range(kh) for j in range(kw)]
    opts = node.opts
    counts = window_counts(node.in_shapes[0], F32, (kh, kw), out_shape[1:3], pads, (opts.stride_h, opts.stride_w))
    clamp_y = clamp(*activation_range(node.opts.fused_activation_function, F32))
    total = np.empty(out_shape, F32)
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        im.load(slots[xi])
        total.fill(0)
        for tap in all_taps:
            np.add(total, tap, out=total)
        y = get()
        np.divide(total, counts, out=y)
        clamp_y(y)
        slots[oi] = y

    return run, [out_shape]
