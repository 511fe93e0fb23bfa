"""Windows of the windowed ops, once for every backend: geometry, padding and the one window
extractor, over an array namespace ``xp`` (NumPy, or jax.numpy in kiln.xla).

Geometry follows LiteRT's ``ComputePaddingHeightWidth`` exactly — output size, and the SAME
padding split whose extra pixel of an odd total goes after, not before — and is the one copy
the kernels, the passes (kiln/passes/pad.py) and the backends use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import product
from typing import Sequence

import numpy as np

from ..errors import OpError
from ..schema import Padding


def _trunc_div(a: int, b: int) -> int:
    """C integer division (rounds toward zero), as LiteRT's size arithmetic does."""
    q = abs(a) // b
    return q if a >= 0 else -q


def out_size(padding: int, size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Output extent of a windowed op along one axis (LiteRT's ComputeOutSize)."""
    if stride <= 0 or dilation <= 0:
        raise OpError(f"stride ({stride}) and dilation ({dilation}) must be positive")
    effective = (kernel - 1) * dilation + 1
    if padding == Padding.SAME:
        return _trunc_div(size + stride - 1, stride)
    if padding == Padding.VALID:
        return _trunc_div(size + stride - effective, stride)
    raise OpError(f"unknown padding {padding}")


def pad_before_after(size: int, kernel: int, stride: int, dilation: int, out: int) -> tuple[int, int]:
    """Padding split (before, after) that LiteRT derives from the output size."""
    effective = (kernel - 1) * dilation + 1
    total = max(0, (out - 1) * stride + effective - size)
    return total // 2, total - total // 2


def window_geometry(opts, shape_hw: Sequence[int], kernel_hw: Sequence[int],
                    dilation: Sequence[int] = (1, 1)):
    """(out_h, out_w), ((top, bottom), (left, right)) of a 2-D windowed op."""
    strides = (opts.stride_h, opts.stride_w)
    outs, pads = [], []
    for size, k, s, d in zip(shape_hw, kernel_hw, strides, dilation):
        o = out_size(opts.padding, size, k, s, d)
        if o < 0:
            raise OpError(f"window {k} (dilation {d}, stride {s}) does not fit input extent {size}")
        outs.append(o)
        pads.append(pad_before_after(size, k, s, d, o))
    return tuple(outs), tuple(pads)


def transpose_conv_geometry(opts, output_shape, x_shape, w_shape):
    """Checked TRANSPOSE_CONV geometry: ((oh, ow), (pad_top, pad_left)). LiteRT pads as if
    the output were the input of the forward convolution; the input must be that
    convolution's output size."""
    shape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    if len(shape) != 4:
        raise OpError(f"TRANSPOSE_CONV: output_shape must hold 4 dims, got {shape}")
    n, h, wd, cin = x_shape
    cout, kh, kw, wcin = w_shape
    if wcin != cin or shape[3] != cout or shape[0] != n:
        raise OpError(f"TRANSPOSE_CONV: input {list(x_shape)}, weights {list(w_shape)} and "
                      f"output_shape {shape} disagree")
    oh, ow = shape[1], shape[2]
    (fh, fw), ((pt, _), (pl, _)) = window_geometry(opts, (oh, ow), (kh, kw))
    if (fh, fw) != (h, wd):
        raise OpError(f"TRANSPOSE_CONV: output_shape {shape} with {kh}x{kw} weights and strides "
                      f"{opts.stride_h}x{opts.stride_w} needs an input of {fh}x{fw}, got {h}x{wd}")
    return (oh, ow), (pt, pl)


@dataclass(frozen=True)
class Window:
    """A windowed op's geometry over the spatial axes of [N, *spatial, C] arrays: the kernel's
    extents, the output's, the padding (before, after) per axis, strides and dilations."""

    kernel: tuple[int, ...]
    out: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    strides: tuple[int, ...]
    dilation: tuple[int, ...]

    @classmethod
    def of_2d(cls, opts, shape_hw, kernel_hw, dilation=(1, 1)) -> "Window":
        """The window of a 2-D op from its options (`window_geometry`)."""
        out, pads = window_geometry(opts, shape_hw, kernel_hw, dilation)
        return cls(tuple(kernel_hw), out, pads, (opts.stride_h, opts.stride_w), tuple(dilation))

    @property
    def padded(self) -> bool:
        return any(p for pair in self.pads for p in pair)

    @cached_property
    def taps(self) -> int:
        return int(np.prod(self.kernel))

    @cached_property
    def pointwise(self) -> bool:
        """A 1x1 window at stride 1: each window is one pixel, the windows the input itself."""
        return self.taps == 1 and all(s == 1 for s in self.strides) and not self.padded

    def padded_shape(self, shape) -> tuple[int, ...]:
        return (shape[0], *[s + a + b for s, (a, b) in zip(shape[1:-1], self.pads)], shape[-1])


def pad(xp, x, window: Window, fill=0):
    """``x`` [N, *spatial, C] padded as ``window`` says with ``fill`` (``x`` itself without padding)."""
    if not window.padded:
        return x
    return xp.pad(x, ((0, 0), *window.pads, (0, 0)), constant_values=fill)


def windows(xp, padded, window: Window, *, taps: bool = False, writeable: bool = False):
    """Every window of an already padded [N, *spatial, C] array: [N, *out, *kernel, C] (the
    im2col layout), or with ``taps`` the list of each kernel tap's [N, *out, C] slice in
    row-major tap order — the one place windows are cut. NumPy gets strided views (read-only
    unless ``writeable``: a transposed convolution adds into them); another namespace gets
    each tap's strided slice (which XLA fuses), stacked."""
    n, c = padded.shape[0], padded.shape[-1]
    k, out, strides, dil = window.kernel, window.out, window.strides, window.dilation
    reach = [(o - 1) * s + (kk - 1) * d for o, s, kk, d in zip(out, strides, k, dil)]
    if all(out) and any(r >= size for r, size in zip(reach, padded.shape[1:-1])):
        raise OpError(f"internal: windows {list(k)} overrun the padded input {list(padded.shape)}")
    if xp is np:
        sn, *spatial, sc = padded.strides
        view = np.lib.stride_tricks.as_strided(
            padded, (n, *out, *k, c),
            (sn, *[a * s for a, s in zip(spatial, strides)], *[a * d for a, d in zip(spatial, dil)], sc),
            writeable=writeable)
        return [view[(slice(None), *[slice(None)] * len(out), *index)] for index in product(*map(range, k))] \
            if taps else view
    cut = [padded[(slice(None), *[slice(i * d, i * d + (o - 1) * s + 1, s) for i, d, o, s in
                                  zip(index, dil, out, strides)])] for index in product(*map(range, k))]
    if taps:
        return cut
    return xp.stack(cut, axis=-2).reshape((n, *out, *k, c))


class Padded:
    """A padded input and its windows (`windows`), cut once. On NumPy a delegate's plan keeps
    it between runs (the reference kernel makes one per call): the border is written once and
    each run only loads the interior (`padded`)."""

    def __init__(self, xp, buf, window: Window):
        self.xp, self.buf, self.window = xp, buf, window
        self._windows = self._taps = None
        if xp is np:
            self.interior = buf[(slice(None), *[slice(a, a + s) for (a, _), s in
                                                zip(window.pads, buf.shape[1:-1] - np.sum(window.pads, axis=1))])]

    def windows(self):
        """[N, *out, *kernel, C]."""
        if self._windows is None:
            self._windows = windows(self.xp, self.buf, self.window)
        return self._windows

    def taps(self) -> list:
        """Each kernel tap's [N, *out, C] slice, in row-major tap order."""
        if self._taps is None:
            self._taps = windows(self.xp, self.buf, self.window, taps=True)
        return self._taps


def kept(workspace: dict, tag: str, shape: tuple, dtype) -> np.ndarray:
    """A NumPy buffer kept in ``workspace`` (made on first use): a delegate's plan reuses it on every
    run, where a fresh array of a few MiB costs more in page faults than the copy into it."""
    key = (tag, shape, dtype)
    buf = workspace.get(key)
    if buf is None:
        buf = workspace[key] = np.empty(shape, dtype)
    return buf


def padded(xp, x, window: Window, zero_point: int, dtype, workspace: dict | None = None, fill=0) -> Padded:
    """``x − zero_point`` in ``dtype``, padded with ``fill`` as ``window`` says: on NumPy a buffer
    kept in ``workspace`` (made on first use) whose interior is loaded; elsewhere a padded
    array XLA computes once for the window slices that read it."""
    if xp is not np:
        x = x.astype(dtype)
        out = pad(xp, x - zero_point if zero_point else x, window, fill)
        return Padded(xp, computed_once(xp, out) if window.taps > 1 else out, window)
    workspace = {} if workspace is None else workspace
    key = ("padded", x.shape, dtype, fill)
    work = workspace.get(key)
    if work is None:
        work = workspace[key] = Padded(np, np.full(window.padded_shape(x.shape), fill, dtype), window)
    if zero_point:
        np.subtract(x, zero_point, out=work.interior, dtype=work.buf.dtype)
    else:
        np.copyto(work.interior, x, casting="unsafe")
    return work


def scatter_add(xp, full, value, tap, window: Window, add=None):
    """``full`` [N, *spatial, C] with ``value`` [N, *in, C] added where kernel tap ``tap`` of
    every input pixel lands (a transposed convolution: from ``tap · dilation``, a step of
    ``stride``); ``add`` replaces ``+`` (a float32 arithmetic's). NumPy adds into ``full`` in
    place; another namespace spreads ``value`` with zeros (interleaved, then padded), which
    XLA fuses into the sum."""
    ins = value.shape[1:-1]
    starts = [t * d for t, d in zip(tap, window.dilation)]
    if xp is np:
        view = windows(np, full, window, writeable=True)[(slice(None), *[slice(None)] * len(ins), *tap)]
        if add is None:
            view += value
        else:
            view[...] = add(view, value)
        return full
    spread = value
    for axis, st in enumerate(window.strides, start=1):
        if st > 1:   # stride − 1 zeros after every element along the axis
            spread = xp.stack([spread] + [xp.zeros_like(spread)] * (st - 1), axis=axis + 1)
            spread = spread.reshape(spread.shape[:axis] + (-1,) + spread.shape[axis + 2:])
    widths = [(s0, max(0, f - s0 - e)) for s0, f, e in zip(starts, full.shape[1:-1], spread.shape[1:-1])]
    spread = xp.pad(spread, ((0, 0), *widths, (0, 0)))[(slice(None), *[slice(0, f) for f in full.shape[1:-1]])]
    return full + spread if add is None else add(full, spread)


def computed_once(xp, x):
    """``x`` unchanged, as a value XLA computes once and stores (NumPy: ``x``).

    Window slices (an im2col's taps, a depthwise convolution's) each read the same padded
    input; XLA's CPU fusion copies a cheap-looking producer into every one of them, so an
    int8 requantization before a 3x3 convolution ran nine times. XLA never duplicates a
    reduction, and the maximum of ``x`` and its type's lowest value is ``x`` exactly (NaN
    stays NaN); ``lax.optimization_barrier`` would not do: XLA's CPU pipeline removes it
    before fusing. Measured (bench/xla_quant_bench.py, bench/xla_bench.py): int8 CNN 1.7x,
    int8 and 16x8 MobileNetV2 1.25x, float CNN / MobileNetV2 at batch 8 1.15-1.2x faster,
    batch 1 float models unchanged.
    """
    if xp is np:
        return x
    kind = np.dtype(x.dtype)
    lowest = np.iinfo(kind).min if kind.kind in "iu" else -np.inf
    return xp.max(xp.stack([x, xp.full_like(x, lowest)]), axis=0)
