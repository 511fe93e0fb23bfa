"""Op family: ops that fit no other family — LOCAL_RESPONSE_NORMALIZATION, BUCKETIZE, the
bit ops BITWISE_XOR and RIGHT_SHIFT, the spectral ops RFFT2D / COMPLEX_ABS / REAL / IMAG
(TF's converter writes them for ``tf.signal.stft`` / ``rfft`` spectrograms), RANK and
NON_MAX_SUPPRESSION_V4 / V5 (``tf.image.non_max_suppression*``).

Semantics follow the LiteRT kernels the builtin op resolver registers:

* LOCAL_RESPONSE_NORMALIZATION is the optimized kernel: the window over channels is
  ``[c - radius, c + radius]`` inclusive, as in TensorFlow (LiteRT's *reference* kernel
  leaves out ``c + radius``; it is not what LiteRT runs by default).
  ``out = x * (bias + alpha * sum(x^2)) ** -beta`` on 4-D float32 input.
* BUCKETIZE returns, as int32, the index of the first boundary greater than the value
  (``std::upper_bound``). Boundaries are float32; int inputs are compared as float32, as the
  C++ comparison converts them. Boundaries must be sorted.
* BITWISE_XOR takes 8/16/32-bit signed or unsigned ints. RIGHT_SHIFT too, and clamps the
  shift to ``[0, bits - 1]``; signed values shift arithmetically. Both broadcast at any
  rank (LiteRT 2.3 does, checked against it).
* RFFT2D: float32 in, complex64 out, over the last two axes; the input is cropped or
  zero-padded to ``fft_length`` (two powers of two) and transformed in double precision.
  With an fft width of 1 LiteRT's result is wrong (its Ooura FFT needs 2 points); kiln
  computes the true transform there, as TensorFlow does.
* NON_MAX_SUPPRESSION_V4 / V5 is LiteRT's greedy (soft-)NMS, quirks included: outputs are
  padded with zeros to ``max_output_size``, and a selected candidate goes back into the
  queue, so a zero-area box (IoU 0 even with itself) can be selected more than once.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from .record import KernelCall, OpDef, OptionsSpec, on_numpy, reject_quantized, takes

# -- LOCAL_RESPONSE_NORMALIZATION -----------------------------------------------------------------

def _channel_window_sums(squares, radius: int):
    """Sums over channels [c - radius, c + radius], zero outside the tensor, from a running
    (prefix) sum (kiln.xla passes one reduce_window)."""
    depth = squares.shape[-1]
    prefix = np.zeros(squares.shape[:-1] + (depth + 1,), np.float64)
    np.cumsum(squares, axis=-1, out=prefix[..., 1:])
    c = np.arange(depth)
    hi, lo = np.minimum(c + radius + 1, depth), np.maximum(c - radius, 0)
    return prefix[..., hi] - prefix[..., lo]


def local_response_normalization(xp, call: KernelCall, x, window_sums=_channel_window_sums):
    """LOCAL_RESPONSE_NORMALIZATION over array namespace ``xp``: ``x * scale ** -beta`` with
    LiteRT's exact forms for beta 1 and 0.5, the squares summed in float64."""
    reject_quantized(call)
    if x.dtype != np.float32:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input type {x.dtype} is not supported "
                      "(float32 only)")
    if x.ndim != 4:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: input must be 4-D, got shape "
                      f"{list(x.shape)}")
    o = call.opts
    radius = int(o.radius)
    if radius < 0:
        raise OpError(f"LOCAL_RESPONSE_NORMALIZATION: radius must not be negative, got {radius}")
    if x.size == 0:
        return x.copy()
    alpha, bias, beta = np.float32(o.alpha), np.float32(o.bias), np.float32(o.beta)
    squares = (x * x * alpha).astype(np.float64)
    scale = window_sums(squares, radius).astype(np.float32) + bias
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if beta == 1:
            factor = np.float32(1) / scale
        elif beta == 0.5:
            factor = np.float32(1) / xp.sqrt(scale)
        else:
            factor = xp.power(scale, -beta)
        return (x * factor).astype(np.float32)


# -- BUCKETIZE ------------------------------------------------------------------------------------

_BUCKETIZE_TYPES = {np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)}


def _bucketize(call: KernelCall, x):
    if x.dtype not in _BUCKETIZE_TYPES:
        raise OpError(f"BUCKETIZE: input type {x.dtype} is not supported "
                      "(float32, float64, int32, int64)")
    bounds = np.asarray(call.opts.boundaries or (), np.float32).reshape(-1)
    if np.any(bounds[1:] < bounds[:-1]):
        raise OpError("BUCKETIZE: boundaries must be sorted in increasing order")
    # C++ compares an integer with a float boundary in float; a double input in double.
    values = x if x.dtype == np.float64 else x.astype(np.float32)
    keys = bounds.astype(values.dtype)
    return np.searchsorted(keys, values, side="right").astype(np.int32)


# -- bit ops --------------------------------------------------------------------------------------

_BIT_TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)}


def _bit_operands(call: KernelCall, a, b) -> None:
    reject_quantized(call)
    if a.dtype != b.dtype:
        raise OpError(f"{call.op.name}: operand types {a.dtype} and {b.dtype} differ")
    if np.dtype(a.dtype) not in _BIT_TYPES:
        raise OpError(f"{call.op.name}: type {a.dtype} is not supported (8, 16 or 32-bit "
                      "signed or unsigned integers)")
    if a.shape == b.shape:
        return
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise OpError(f"{call.op.name}: operand shapes {list(a.shape)} and {list(b.shape)} do "
                      "not broadcast") from None


def bitwise_xor(xp, call: KernelCall, a, b):
    """BITWISE_XOR over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla)."""
    _bit_operands(call, a, b)
    return xp.bitwise_xor(a, b)


def right_shift(xp, call: KernelCall, a, b):
    """RIGHT_SHIFT over ``xp``: the shift clamped to the type's width (as LiteRT)."""
    _bit_operands(call, a, b)
    dtype = np.dtype(a.dtype)
    bits = dtype.itemsize * 8
    shift = xp.clip(b, 0, bits - 1) if dtype.kind == "i" else xp.minimum(b, bits - 1)
    return xp.right_shift(a, xp.asarray(shift).astype(dtype))


# -- spectral --------------------------------------------------------------------------------------

def _is_power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _rfft2d(call: KernelCall, x, fft_length):
    if x.dtype != np.float32:
        raise OpError(f"RFFT2D: input type {x.dtype} is not supported (float32 only)")
    if x.ndim < 2:
        raise OpError(f"RFFT2D: input must have at least 2 dimensions, got {list(x.shape)}")
    lengths = np.asarray(fft_length)
    if lengths.dtype != np.int32 or lengths.shape != (2,):
        raise OpError(f"RFFT2D: fft_length must be an int32 vector of 2, got {lengths.dtype} "
                      f"{list(lengths.shape)}")
    fh, fw = (int(v) for v in lengths)
    if not (_is_power_of_two(fh) and _is_power_of_two(fw)):
        raise OpError(f"RFFT2D: fft_length {[fh, fw]} must be powers of two")
    # rfft2 with s= crops or zero-pads each axis, as LiteRT fills its working buffer.
    out = np.fft.rfft2(x.astype(np.float64), s=(fh, fw), axes=(-2, -1))
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as LiteRT narrows it
        return out.astype(np.complex64)


def _complex_part(name: str, fn):
    def kernel(call: KernelCall, x):
        if x.dtype not in (np.complex64, np.complex128):
            raise OpError(f"{name}: input must be complex64 or complex128, got {x.dtype}")
        return np.ascontiguousarray(fn(x))

    return kernel


def _rank(call: KernelCall, x):
    return np.array(x.ndim, np.int32)


# -- NON_MAX_SUPPRESSION_V4 / V5 ------------------------------------------------------------------

def _scalar(call: KernelCall, value, what: str, dtype) -> float | int:
    arr = np.asarray(value)
    if arr.dtype != dtype or arr.ndim != 0:
        raise OpError(f"{call.op.name}: {what} must be a {np.dtype(dtype).name} scalar, got "
                      f"{arr.dtype} {list(arr.shape)}")
    return arr[()]


def _cpp_min(a, b):
    """std::min(a, b): ``b < a ? b : a`` (NaN handling included, unlike np.minimum)."""
    return np.where(b < a, b, a)


def _cpp_max(a, b):
    """std::max(a, b): ``a < b ? b : a``."""
    return np.where(a < b, b, a)


class _Boxes:
    """Corner-normalised boxes and areas in float32, for IoU exactly as LiteRT computes it
    (with std::min / std::max, so a NaN corner may be dropped in favour of the other)."""

    def __init__(self, boxes: np.ndarray):
        y1, x1, y2, x2 = boxes.T
        self.ymin, self.ymax = _cpp_min(y1, y2), _cpp_max(y1, y2)
        self.xmin, self.xmax = _cpp_min(x1, x2), _cpp_max(x1, x2)
        self.area = (self.ymax - self.ymin) * (self.xmax - self.xmin)

    def iou(self, i: int, js: np.ndarray) -> np.ndarray:
        """IoU of box i with boxes js; 0 where either area is not positive."""
        zero = np.float32(0)

        def overlap(lo, hi):
            return _cpp_max(_cpp_min(hi[i], hi[js]) - _cpp_max(lo[i], lo[js]), zero)

        inter = overlap(self.ymin, self.ymax) * overlap(self.xmin, self.xmax)
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / (self.area[i] + self.area[js] - inter)
        return np.where((self.area[i] <= 0) | (self.area[js] <= 0), zero, iou).astype(np.float32)


class _PriorityQueue:
    """Max-heap on score with libstdc++'s push_heap / pop_heap moves, so candidates with
    equal scores come out in the order LiteRT's std::priority_queue gives them (Python's
    heapq breaks ties differently). Entries are (score, box index, suppress_begin_index)."""

    def __init__(self):
        self.items: list[tuple] = []

    def __len__(self) -> int:
        return len(self.items)

    def _sift_up(self, hole: int, item: tuple) -> None:
        items = self.items
        parent = (hole - 1) // 2
        while hole > 0 and items[parent][0] < item[0]:
            items[hole] = items[parent]
            hole, parent = parent, (parent - 1) // 2
        items[hole] = item

    def push(self, item: tuple) -> None:
        self.items.append(item)
        self._sift_up(len(self.items) - 1, item)

    def pop(self) -> tuple:
        items = self.items
        top, last = items[0], items.pop()
        size = len(items)
        if not size:
            return top
        # Walk the hole at the root down to a leaf along the larger child (the right one on
        # ties), then sift the former last element up from there.
        hole = child = 0
        while child < (size - 1) // 2:
            child = 2 * child + 2
            if items[child][0] < items[child - 1][0]:
                child -= 1
            items[hole] = items[child]
            hole = child
        if size % 2 == 0 and child == (size - 2) // 2:
            child = 2 * child + 1
            items[hole] = items[child]
            hole = child
        self._sift_up(hole, last)
        return top


def _nms(boxes, scores, max_out: int, iou_thr, score_thr, sigma):
    """LiteRT's greedy loop, in its order: highest score first, the newest selections
    compared first, soft-NMS decay applied one selection at a time."""
    b = _Boxes(boxes)
    queue = _PriorityQueue()
    for i in np.flatnonzero(scores > score_thr):
        queue.push((scores[i], int(i), 0))
    chosen: list[int] = []
    chosen_scores: list[np.float32] = []
    wanted = min(len(queue), max_out)
    scale = np.float32(-0.5 / float(sigma)) if sigma > 0 else np.float32(0)  # double, as C++
    while len(chosen) < wanted and len(queue):
        score, index, begin = queue.pop()
        original = score
        hard = False
        if len(chosen) > begin:
            ious = b.iou(index, np.asarray(chosen[begin:][::-1], np.int64))
            for iou in ious:
                if iou >= iou_thr:
                    hard = True
                    break
                if sigma > 0:
                    score = np.float32(score * np.exp(np.float32(scale * iou * iou)))
                if score <= score_thr:
                    break
        begin = len(chosen)
        if hard:
            continue
        if score == original:
            chosen.append(index)
            chosen_scores.append(score)
        if score > score_thr:  # LiteRT pushes a selected candidate back too
            queue.push((score, index, begin))
    return chosen, chosen_scores


def _nms_kernel(call: KernelCall, boxes, scores, max_output_size, iou_threshold,
                score_threshold, sigma=None):
    if boxes.dtype != np.float32 or boxes.ndim != 2 or boxes.shape[1] != 4:
        raise OpError(f"{call.op.name}: boxes must be float32 [num_boxes, 4], got {boxes.dtype} "
                      f"{list(boxes.shape)}")
    if scores.dtype != np.float32 or scores.shape != boxes.shape[:1]:
        raise OpError(f"{call.op.name}: scores must be float32 [{boxes.shape[0]}], got "
                      f"{scores.dtype} {list(scores.shape)}")
    max_out = int(_scalar(call, max_output_size, "max_output_size", np.int32))
    if max_out < 0:
        raise OpError(f"{call.op.name}: max_output_size must not be negative, got {max_out}")
    iou_thr = _scalar(call, iou_threshold, "iou_threshold", np.float32)
    score_thr = _scalar(call, score_threshold, "score_threshold", np.float32)
    soft = sigma is not None
    s = _scalar(call, sigma, "soft_nms_sigma", np.float32) if soft else np.float32(0)
    if s < 0:
        raise OpError(f"{call.op.name}: soft_nms_sigma must not be negative, got {float(s)}")
    chosen, chosen_scores = _nms(boxes, scores, max_out, iou_thr, score_thr, s)
    indices = np.zeros(max_out, np.int32)
    indices[:len(chosen)] = chosen
    count = np.array(len(chosen), np.int32)
    if not soft:
        return indices, count
    selected = np.zeros(max_out, np.float32)
    selected[:len(chosen)] = chosen_scores
    return indices, selected, count


def _nms_v4(call: KernelCall, boxes, scores, max_output_size, iou_threshold, score_threshold):
    return _nms_kernel(call, boxes, scores, max_output_size, iou_threshold, score_threshold)


def _nms_v5(call: KernelCall, boxes, scores, max_output_size, iou_threshold, score_threshold,
            soft_nms_sigma):
    return _nms_kernel(call, boxes, scores, max_output_size, iou_threshold, score_threshold,
                       soft_nms_sigma)


# -- records --------------------------------------------------------------------------------------

def _table(name: str, **defaults) -> OptionsSpec:
    return OptionsSpec(table=name, defaults=defaults)


# op_version.cc has no rule for these ops (always version 1); register.cc registers 1 only.
# Ops whose schema table is empty get options=None: TF's converter writes no table for them.
OPS: tuple[OpDef, ...] = (
    OpDef("LOCAL_RESPONSE_NORMALIZATION", on_numpy(local_response_normalization),
          _table("LocalResponseNormalizationOptions", radius=0, bias=0.0, alpha=0.0, beta=0.0),
          runtime_versions=("1.5.0",), types=takes("float32")),
    OpDef("BUCKETIZE", _bucketize, _table("BucketizeOptions", boundaries=()),
          runtime_versions=("2.8.0",)),
    OpDef("BITWISE_XOR", on_numpy(bitwise_xor),
          runtime_versions=("2.13.0",), types=takes("int8 uint8 int16 uint16 int32 uint32")),
    OpDef("RIGHT_SHIFT", on_numpy(right_shift),
          runtime_versions=("2.13.0",)),
    OpDef("RFFT2D", _rfft2d,
          runtime_versions=("2.5.0",)),
    OpDef("COMPLEX_ABS", _complex_part("COMPLEX_ABS", np.abs),
          runtime_versions=("2.5.0",)),
    OpDef("REAL", _complex_part("REAL", np.real),
          runtime_versions=("2.5.0",)),
    OpDef("IMAG", _complex_part("IMAG", np.imag),
          runtime_versions=("2.5.0",)),
    OpDef("RANK", _rank,
          runtime_versions=("1.14.0",),
          reads_shape_only=True),
    OpDef("NON_MAX_SUPPRESSION_V4", _nms_v4,
          runtime_versions=("2.1.0",)),
    OpDef("NON_MAX_SUPPRESSION_V5", _nms_v5,
          runtime_versions=("2.1.0",)),
)

__all__ = ["OPS", "bitwise_xor", "local_response_normalization", "right_shift"]
