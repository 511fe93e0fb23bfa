"""Op family: reductions, arg-max/min, top-k and cumulative sum.

Reducers take their axes from the second operand (constant or computed; scalar or 1-D;
negative and repeated axes allowed) and ``keep_dims`` from ReducerOptions. Behaviour of
LiteRT's builtin kernels reproduced here:

* REDUCE_MAX/MIN fold ``cur = cur > x ? cur : x`` over the reduced elements in row-major
  order: a NaN is kept only if nothing follows it, and everything before the last NaN is
  forgotten. Empty reductions give the type's lowest/highest finite value.
* Integer MEAN truncates toward zero; float MEAN of nothing is NaN.
* ARG_MAX/ARG_MIN take the first extreme; a NaN never wins unless it comes first.
* TOPK_V2 orders ties by ascending index and ranks NaN below every number.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..schema import DType
from ..kernels import reduce
from ..kernels.reduce import reduction_axes
from .record import (
    KernelCall,
    OpDef,
    OptionsSpec,
    input_dtype,
    family,
    on_codes,
    output_dtype,
    reject_quantized,
    takes,
)
from .traits import INT8_ONLY, own, same

# -- axes ---------------------------------------------------------------------------------

def _axis_values(call: KernelCall, axis: np.ndarray) -> list[int]:
    a = np.asarray(axis)
    if a.dtype.kind not in "iu":
        raise OpError(f"{call.op.name}: axis operand must be int32 or int64, got {a.dtype}")
    return a.reshape(-1).tolist()


def _single_axis(call: KernelCall, x: np.ndarray, axis: np.ndarray) -> int:
    values = _axis_values(call, axis)
    if len(values) != 1:
        raise OpError(f"{call.op.name}: expected one axis, got {values}")
    return reduction_axes(call, x, np.asarray(values[:1]))[0]


def _to_rows(xp, x, axes: tuple[int, ...]):
    """Kept axes first, reduced axes flattened (row-major) into the last one."""
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = xp.transpose(x, kept + list(axes))
    k = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    return moved.reshape([x.shape[i] for i in kept] + [k])


# -- reducers -----------------------------------------------------------------------------

def _reducer(fn):
    """A reducer over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla, where the axes
    are static), ``fn(xp, x, axes)`` giving the result without kept dims."""

    def reduce(xp, call: KernelCall, x, axis):
        axes = reduction_axes(call, x, axis)
        kept_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        with np.errstate(all="ignore"):
            out = fn(xp, x, axes)
        result = xp.asarray(out).astype(x.dtype, copy=False)
        return result.reshape(kept_shape) if call.opts.keep_dims else result

    reduce.__name__ = reduce.__qualname__ = fn.__name__.lstrip("_")
    return reduce


def _kernel(reduce, *, shared_ok: bool = False):
    def kernel(call: KernelCall, x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        reject_quantized(call, shared_ok=shared_ok)
        return reduce(np, call, x, axis)

    return kernel


def _prod(xp, x, axes):
    return xp.prod(x, axis=axes, dtype=x.dtype)


def _extreme(pick_max: bool):
    """REDUCE_MAX / REDUCE_MIN with LiteRT's fold order (see the module docstring)."""

    def fn(xp, x, axes):
        dtype = np.dtype(x.dtype)
        if dtype.kind != "f" and dtype.name != "bfloat16":   # bool and integers
            info = np.iinfo(dtype) if dtype != np.bool_ else None
            init = (info.min if pick_max else info.max) if info else (not pick_max)
            reduce = xp.max if pick_max else xp.min
            return reduce(x, axis=axes, initial=init)
        rows = _to_rows(xp, x, axes)
        k = rows.shape[-1]
        if k == 0:
            info = np.finfo(dtype)
            return xp.full(rows.shape[:-1], info.min if pick_max else info.max, dtype)
        init = -np.inf if pick_max else np.inf
        nan = xp.isnan(rows)
        has_nan = nan.any(axis=-1)
        last_nan = xp.where(has_nan, k - 1 - xp.argmax(nan[..., ::-1], axis=-1), -1)
        after = xp.arange(k) > last_nan[..., None]
        tail = xp.where(after, rows, init)
        out = tail.max(axis=-1) if pick_max else tail.min(axis=-1)
        return xp.where(last_nan == k - 1, np.nan, out).astype(dtype)

    fn.__name__ = "reduce_max" if pick_max else "reduce_min"
    return fn


def _any(xp, x, axes):
    return xp.any(x, axis=axes)


def _all(xp, x, axes):
    return xp.all(x, axis=axes)


#: REDUCE_PROD / MAX / MIN / ANY / ALL, each ``fn(xp, call, x, axis)``: the reference kernel on
#: NumPy and the XLA lowering on jax.numpy.
REDUCERS = {"REDUCE_PROD": _reducer(_prod), "REDUCE_MAX": _reducer(_extreme(True)),
            "REDUCE_MIN": _reducer(_extreme(False)), "REDUCE_ANY": _reducer(_any), "REDUCE_ALL": _reducer(_all)}


# -- arg max/min ----------------------------------------------------------------------------

def index_dtype(call: KernelCall, i: int, fallback) -> np.dtype:
    """Index output type: the output tensor's type when it is an integer type."""
    dt = np.dtype(call.out_dtypes[i]) if len(call.out_dtypes) > i and call.out_dtypes[i] else None
    if dt is not None and dt.kind in "iu":
        return dt
    return np.dtype(fallback)


def arg_extreme(xp, call: KernelCall, x, axis, pick_max: bool):
    """ARG_MAX / ARG_MIN, checked, over array namespace ``xp`` (NumPy here, jax.numpy in
    kiln.xla): the first index of the extreme along the one axis. NaN never replaces the
    running best, so it only wins from position 0."""
    if x.ndim == 0:
        raise OpError(f"{call.op.name}: input must have at least one dimension")
    ax = _single_axis(call, x, axis)
    if x.shape[ax] == 0:
        raise OpError(f"{call.op.name}: cannot reduce an empty axis {ax}")
    opt = call.opts.output_type
    fallback = DType(opt).numpy if opt in (DType.INT32, DType.INT64) else np.int64
    floating = np.dtype(x.dtype).kind == "f" or np.dtype(x.dtype).name == "bfloat16"
    v = xp.where(xp.isnan(x), -np.inf if pick_max else np.inf, x) if floating else x
    idx = xp.argmax(v, axis=ax) if pick_max else xp.argmin(v, axis=ax)
    if floating:
        idx = xp.where(xp.isnan(xp.take(x, 0, axis=ax)), 0, idx)
    return xp.asarray(idx).astype(index_dtype(call, 0, fallback))


def _arg(pick_max: bool):
    def kernel(call: KernelCall, x: np.ndarray, axis: np.ndarray) -> np.ndarray:
        reject_quantized(call, shared_ok=True)
        return arg_extreme(np, call, x, axis, pick_max)

    return kernel


# -- top-k --------------------------------------------------------------------------------

def _integer_top_k(x: np.ndarray, k: int):
    """The ``k`` largest of the last axis high to low, ties by ascending index (kiln.xla
    passes lax.top_k, which orders them so)."""
    n = x.shape[-1]
    rev = x[..., ::-1].astype(np.int8) if x.dtype == np.bool_ else x[..., ::-1]
    order = (n - 1 - np.argsort(rev, axis=-1, kind="stable")[..., ::-1])[..., :k]
    return np.take_along_axis(x, order, axis=-1), order


def top_k(xp, call: KernelCall, x, k, integer_top_k=_integer_top_k):
    """TOPK_V2 over array namespace ``xp``: floats high to low, ties by ascending index, NaN last."""
    if x.ndim == 0:
        raise OpError("TOPK_V2: input must have at least one dimension")
    kv = np.asarray(k).reshape(-1)
    if kv.size != 1 or not np.issubdtype(kv.dtype, np.integer):
        raise OpError(f"TOPK_V2: k must be one integer, got {np.asarray(k).tolist()}")
    kk, n = int(kv[0]), x.shape[-1]
    if not 0 <= kk <= n:
        raise OpError(f"TOPK_V2: k={kk} must be in [0, {n}] (the last dimension)")
    if xp.issubdtype(x.dtype, xp.floating):
        with np.errstate(invalid="ignore"):
            order = xp.argsort(-x, axis=-1, stable=True)[..., :kk]
        values = xp.take_along_axis(x, order, axis=-1)
    else:
        values, order = integer_top_k(x, kk)
    return values, order.astype(index_dtype(call, 1, np.int32))


def _top_k(call: KernelCall, x: np.ndarray, k: np.ndarray):
    reject_quantized(call, shared_ok=True)
    return top_k(np, call, x, k)


# -- cumulative sum -----------------------------------------------------------------------

def cumsum(xp, call: KernelCall, x, axis):
    """CUMSUM over array namespace ``xp`` (NumPy here, jax.numpy in kiln.xla)."""
    if x.ndim == 0:
        raise OpError("CUMSUM: input must have at least one dimension")
    ax = _single_axis(call, x, axis)
    v = xp.flip(x, ax) if call.opts.reverse else x
    with np.errstate(all="ignore"):
        out = xp.cumsum(v, axis=ax, dtype=x.dtype)  # sequential, like LiteRT
    if call.opts.exclusive:
        along = (slice(None),) * ax
        head = xp.zeros_like(out[along + (slice(0, 1),)])
        out = xp.concatenate([head, out[along + (slice(0, x.shape[ax] - 1),)]], axis=ax)
    return xp.flip(out, ax) if call.opts.reverse else out


def _cumsum(call: KernelCall, x: np.ndarray, axis: np.ndarray) -> np.ndarray:
    reject_quantized(call)
    return cumsum(np, call, x, axis)


# -- records --------------------------------------------------------------------------------

_REDUCER = OptionsSpec("ReducerOptions", {"keep_dims": False})


def _by_input_type(table: dict):
    def rule(op) -> int:
        dt = input_dtype(op, 0)
        for types, version in table.items():
            if dt in types:
                return version
        return 1

    return rule


_I8, _I16 = (DType.INT8,), (DType.INT16,)
_MEAN_MAX_MIN = _by_input_type({_I16: 3, _I8: 2})


def _top_k_version(op) -> int:
    if DType.INT16 in (input_dtype(op, 0), input_dtype(op, 1), output_dtype(op, 1)):
        return 3
    return 2 if input_dtype(op, 0) == DType.INT8 else 1


# Order-only kernels: on integer codes they give the quantized result (shared parameters).
_REDUCE_MAX, _REDUCE_MIN = (_kernel(REDUCERS[name], shared_ok=True) for name in ("REDUCE_MAX", "REDUCE_MIN"))
_ARG_MAX, _ARG_MIN = _arg(True), _arg(False)

OPS: tuple[OpDef, ...] = (
    OpDef("MEAN", options=_REDUCER, version=_MEAN_MAX_MIN, max_version=3, **family(reduce.MEAN),
          runtime_versions=("1.6.0", "1.14.0", "2.4.0"),
          quantization=own(),
          reduces=True, types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("SUM", options=_REDUCER, version=_by_input_type({_I8: 2}), max_version=2, **family(reduce.SUM),
          runtime_versions=("1.10.0", "1.15.0"),
          # int8 only, as TF quantizes it (it leaves SUM float in 16x8); the kernel is LiteRT's
          # optimized one, bit-exact with its default resolver (its reference kernel is wrong)
          quantization=own(types=INT8_ONLY), reduces=True,
          types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("REDUCE_PROD", _kernel(REDUCERS["REDUCE_PROD"]), _REDUCER,
          _by_input_type({(DType.INT8, DType.INT16): 2}), 2,
          runtime_versions=("1.11.0", "2.6.0"),
          reduces=True, types=takes("float32 int8 uint8 int16 int32 int64")),
    OpDef("REDUCE_MAX", _REDUCE_MAX, _REDUCER, _MEAN_MAX_MIN, 3,
          runtime_versions=("1.11.0", "1.14.0", "2.5.0"), quantized=on_codes(_REDUCE_MAX),
          quantization=same(),
          reduces=True, types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("REDUCE_MIN", _REDUCE_MIN, _REDUCER, _MEAN_MAX_MIN, 3,
          runtime_versions=("1.11.0", "1.14.0", "2.5.0"), quantized=on_codes(_REDUCE_MIN),
          quantization=same(),
          reduces=True, types=takes("float16 float32 int8 uint8 int16 int32 int64")),
    OpDef("REDUCE_ANY", _kernel(REDUCERS["REDUCE_ANY"]), _REDUCER,
          runtime_versions=("1.11.0",),
          reduces=True),
    OpDef("REDUCE_ALL", _kernel(REDUCERS["REDUCE_ALL"]), _REDUCER,
          runtime_versions=("2.6.0",),
          reduces=True),
    OpDef("ARG_MAX", _ARG_MAX, OptionsSpec("ArgMaxOptions", {"output_type": DType.FLOAT32}),
          _by_input_type({(DType.BOOL,): 3, _I8: 2}), 3,
          runtime_versions=("1.9.0", "1.14.0", "2.9.0"), quantized=on_codes(_ARG_MAX),
          types=takes("bool float32 int8 uint8 int32")),
    OpDef("ARG_MIN", _ARG_MIN, OptionsSpec("ArgMinOptions", {"output_type": DType.FLOAT32}),
          _by_input_type({(DType.BOOL,): 3, _I8: 2}), 3,
          runtime_versions=("1.9.0", "1.14.0", "2.9.0"), quantized=on_codes(_ARG_MIN),
          types=takes("bool float32 int8 uint8 int32")),
    OpDef("TOPK_V2", _top_k, OptionsSpec("TopKV2Options"), _top_k_version, 3,
          runtime_versions=("1.7.0", "1.14.0", "2.13.0"), types=takes("float32 int8 uint8 int16 int32 int64")),
    OpDef("CUMSUM", _cumsum,
          OptionsSpec("CumsumOptions", {"exclusive": False, "reverse": False}),
          runtime_versions=("2.4.0",), types=takes("float32 int32 int64")),
)

__all__ = ["OPS", "REDUCERS", "cumsum", "reduction_axes", "top_k"]
