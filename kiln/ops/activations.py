"""Op family: activation functions and normalisations over the last axis.

Float kernels compute in float64 where that is cheap and round once to the tensor type,
which keeps them within a few float32 ulps of LiteRT's builtin kernels. Notes on LiteRT
behaviour that the kernels reproduce:

* GELU ``approximate=False`` is the exact ``0.5 x erfc(-x / sqrt 2)`` (LiteRT uses erfc to
  avoid cancellation for large negative x); ``approximate=True`` is the tanh formula.
* L2_NORMALIZATION divides by ``max(sqrt(sum x^2), 1e-6)`` and only accepts a fused NONE.
* HARD_SWISH is ``x * relu6(x + 3) / 6`` evaluated in the input type.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import chebyshev

from ..errors import OpError
from ..schema import Activation, DType
from ..kernels import activations as activation_kernels
from ..kernels import softmax as softmax_kernels
from .record import (
    UNLISTED,
    KernelCall,
    OpDef,
    OptionsSpec,
    input_dtype,
    on_numpy,
    output_dtype,
    reject_quantized,
    takes,
)
from .traits import INT8_ONLY, fixed, own


def _float_input(call: KernelCall, x: np.ndarray) -> None:
    reject_quantized(call)
    if x.dtype.kind != "f":
        raise OpError(f"{call.op.name}: input type {x.dtype} is not supported (float only)")


def _float_only(fn, *, last_axis: bool = False):
    """Reference kernel of ``fn(np, call, x, *rest)`` for a float ``x`` (``last_axis``: a
    normalisation over the last axis, which needs at least one dimension)."""

    def kernel(call: KernelCall, x: np.ndarray, *rest) -> np.ndarray:
        _float_input(call, x)
        if last_axis and x.ndim < 1:
            raise OpError(f"{call.op.name}: input must have at least one dimension")
        return fn(np, call, x, *rest)

    return kernel


def _float_kernel(fn):
    """Kernel for a float-only element-wise function, evaluated in float64."""

    def kernel(call: KernelCall, x: np.ndarray) -> np.ndarray:
        _float_input(call, x)
        with np.errstate(all="ignore"):
            return np.asarray(fn(call, x.astype(np.float64))).astype(x.dtype)

    return kernel


# -- erfc for GELU ------------------------------------------------------------------------
# erfc(z) = g(z) exp(-z^2) for z >= 0 with g smooth and slowly varying; g is fitted once, at
# import, by a Chebyshev series in t = (z - K) / (z + K), which maps [0, inf) onto [-1, 1).
# Relative error of erfc is below 1e-12 over the whole line (checked in the tests against
# math.erfc), far inside float32 resolution; evaluation is a vectorised Clenshaw sum.

_ERFC_K = 3.0
_ERFC_DEGREE = 24


def _erfc_scaled_exact(z: float) -> float:
    """erfc(z) * exp(z^2) for z >= 0 (asymptotic series where exp(z^2) overflows)."""
    if z < 25.0:
        return math.erfc(z) * math.exp(z * z)
    r = 1.0 / (z * z)
    series = 1.0 - 0.5 * r + 0.75 * r ** 2 - 1.875 * r ** 3 + 6.5625 * r ** 4
    return series / (z * math.sqrt(math.pi))


def _fit_erfc_scaled() -> np.ndarray:
    n = _ERFC_DEGREE + 1
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)  # Chebyshev nodes
    z = _ERFC_K * (1.0 + t) / (1.0 - t)
    values = np.array([_erfc_scaled_exact(float(v)) for v in z])
    return chebyshev.chebfit(t, values, _ERFC_DEGREE)


_ERFC_COEF = _fit_erfc_scaled()
#: The same coefficients as Python floats, for `_chebval` (float64 arithmetic either way).
_ERFC_TERMS = tuple(float(v) for v in _ERFC_COEF)


def _chebval(t: np.ndarray, c: tuple[float, ...]) -> np.ndarray:
    """``chebyshev.chebval(t, c)``: the same Clenshaw recurrence, without its set-up cost."""
    t2 = 2 * t
    c0, c1 = c[-2], c[-1]
    for i in range(3, len(c) + 1):
        c0, c1 = c[-i] - c1, c0 + c1 * t2
    return c0 + c1 * t


def erfc(z: np.ndarray) -> np.ndarray:
    """Complementary error function of a float64 array (vectorised, ~1e-12 relative)."""
    z = np.asarray(z, np.float64)
    a = np.abs(z)
    with np.errstate(all="ignore"):
        t = np.where(np.isinf(a), 1.0, (a - _ERFC_K) / (a + _ERFC_K))
        pos = _chebval(t, _ERFC_TERMS) * np.exp(-a * a)
    return np.where(z < 0, 2.0 - pos, pos)


def gelu(xp, call: KernelCall, x, erfc=erfc):
    """GELU over array namespace ``xp`` (NumPy here; kiln.xla passes jax.numpy and its erfc)."""
    if call.opts.approximate:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + xp.tanh(inner))
    return 0.5 * x * erfc(x * -math.sqrt(0.5))


# -- simple activations ---------------------------------------------------------------------

def _tanh(call, x):
    return np.tanh(x)


def _logistic(call, x):
    return 1.0 / (1.0 + np.exp(-x))


def _elu(call, x):
    return np.where(x < 0, np.expm1(x), x)


def _clamp_kernel(lo: float, hi: float | None):
    """RELU-family kernel: a clamp (NaN passes through, as in LiteRT)."""

    def kernel(call: KernelCall, x: np.ndarray) -> np.ndarray:
        reject_quantized(call)
        if hi is not None and x.dtype.kind == "f":
            return x.clip(lo, hi)  # what np.clip computes, without its wrappers
        return np.clip(x, lo, hi).astype(x.dtype, copy=False)

    return kernel


def _hard_swish(call: KernelCall, x: np.ndarray) -> np.ndarray:
    _float_input(call, x)
    with np.errstate(all="ignore"):
        relu6 = np.clip(x + x.dtype.type(3), 0, 6).astype(x.dtype)
        return (x * relu6) / x.dtype.type(6)


def _leaky_relu(call: KernelCall, x: np.ndarray) -> np.ndarray:
    _float_input(call, x)
    alpha = x.dtype.type(call.opts.alpha)
    return np.where(x > 0, x, x * alpha)


def prelu(xp, call: KernelCall, x, alpha):
    """PRELU over array namespace ``xp``: alpha broadcasts into the input's shape (LiteRT's
    builtin PRELU needs out == in)."""
    try:
        fits = np.broadcast_shapes(x.shape, alpha.shape) == x.shape
    except ValueError:
        fits = False
    if not fits:
        raise OpError(f"PRELU: alpha shape {list(alpha.shape)} does not broadcast into the "
                      f"input shape {list(x.shape)}")
    return xp.where(x >= 0, x, x * alpha.astype(x.dtype))


# -- normalisations over the last axis ---------------------------------------------------
# Written once over an array namespace: the reference kernels evaluate them in float64
# (``wide``) and round once; kiln.xla passes ``wide=None``, evaluating in the tensor type.

def softmax(xp, call: KernelCall, x, wide=np.float64):
    """SOFTMAX of a checked float input (also the NumPy delegate's, without the checks)."""
    beta = float(call.opts.beta)
    with np.errstate(all="ignore"):
        v = x if wide is None else x.astype(wide)
        shifted = v - xp.max(v, axis=-1, keepdims=True)
        e = xp.exp(shifted * beta if beta != 1.0 else shifted)  # x * 1.0 is x, bit for bit
        return (e / xp.sum(e, axis=-1, keepdims=True)).astype(x.dtype)


def log_softmax(xp, call: KernelCall, x, wide=np.float64):
    with np.errstate(all="ignore"):
        v = x if wide is None else x.astype(wide)
        shifted = v - xp.max(v, axis=-1, keepdims=True)
        return (shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))).astype(x.dtype)


def l2_normalization(xp, call: KernelCall, x):
    """``x / max(|x|, 1e-6)``, the norm summed in float64 by both backends."""
    act = call.opts.fused_activation_function
    if act != Activation.NONE:
        raise OpError(f"L2_NORMALIZATION: fused activation {Activation(act).name} is not "
                      f"supported (LiteRT accepts only NONE)")
    with np.errstate(all="ignore"):
        norm = xp.sqrt(xp.sum(xp.square(x.astype(np.float64)), axis=-1, keepdims=True)).astype(x.dtype)
        return (x / xp.maximum(norm, x.dtype.type(1e-6))).astype(x.dtype)


# -- version rules --------------------------------------------------------------------------

def _int16_8(v16: int, v8: int, *, i8_types=(DType.INT8,)):
    """Version rule "int16 input -> v16, int8 input -> v8, else 1"."""

    def rule(op) -> int:
        dt = input_dtype(op, 0)
        if dt == DType.INT16:
            return v16
        return v8 if dt in i8_types else 1

    return rule


def _tanh_logistic_version(op) -> int:
    if input_dtype(op, 0) == DType.INT16 and output_dtype(op, 0) == DType.INT16:
        return 3
    return 2 if input_dtype(op, 0) == DType.INT8 else 1


def _gelu_version(op) -> int:
    return 2 if input_dtype(op, 0) in (DType.INT8, DType.UINT8) else 1


def _leaky_relu_version(op) -> int:
    return 2 if input_dtype(op, 0) == DType.INT16 else 1


def _l2_version(op) -> int:
    return 2 if output_dtype(op, 0) == DType.INT8 else 1


def _log_softmax_version(op) -> int:
    return 2 if input_dtype(op, 0) == DType.INT8 else 1


OPS: tuple[OpDef, ...] = (
    OpDef("TANH", _float_kernel(_tanh), None, _tanh_logistic_version, 3,
          runtime_versions=("1.14.0", "1.14.0", "2.3.0"), quantized=activation_kernels.TANH,
          quantization=fixed((1 / 128, 0), (1 / 32768, 0))),
    OpDef("LOGISTIC", _float_kernel(_logistic), None, _tanh_logistic_version, 3,
          runtime_versions=("1.14.0", "1.14.0", "2.3.0"), quantized=activation_kernels.LOGISTIC,
          quantization=fixed((1 / 256, -128), (1 / 32768, 0))),
    OpDef("RELU", _clamp_kernel(0, None), None,
          _int16_8(3, 2, i8_types=(DType.INT8, DType.UINT8)), 3,
          runtime_versions=("1.5.0", "2.1.0", "2.5.0"), quantized=activation_kernels.RELU,
          quantization=own(),
          fuses_as=Activation.RELU),
    OpDef("RELU6", _clamp_kernel(0, 6), None, _int16_8(3, 2), 3,
          runtime_versions=("1.5.0", "1.14.0", "2.5.0"), quantized=activation_kernels.RELU6,
          quantization=own(),
          fuses_as=Activation.RELU6, types=takes("float16 float32 int8 uint8 int16")),
    OpDef("RELU_N1_TO_1", _clamp_kernel(-1, 1),
          runtime_versions=("1.5.0",), quantized=activation_kernels.RELU_N1_TO_1,
          quantization=own(types=INT8_ONLY),
          fuses_as=Activation.RELU_N1_TO_1),
    OpDef("LEAKY_RELU", _leaky_relu, OptionsSpec("LeakyReluOptions", {"alpha": 0.0}),
          _leaky_relu_version, 2,
          runtime_versions=("1.13.1", "2.3.0"), quantized=activation_kernels.LEAKY_RELU,
          quantization=own(), types=takes("float16 float32 int8 uint8 int16")),
    OpDef("PRELU", _float_only(prelu),
          runtime_versions=("1.8.0",), quantized=activation_kernels.PRELU,
          quantization=own(0, 1, symmetric=(1,))),
    OpDef("ELU", _float_kernel(_elu),
          runtime_versions=("1.14.0",), quantized=activation_kernels.ELU,
          # TF 2.21 keeps ELU float; LiteRT has an int8 lookup-table kernel
          quantization=own(types=INT8_ONLY)),
    OpDef("GELU", _float_kernel(on_numpy(gelu)), OptionsSpec("GeluOptions", {"approximate": False}),
          _gelu_version, 3,
          runtime_versions=("2.9.0", "2.9.0", UNLISTED), quantized=activation_kernels.GELU,
          quantization=own()),
    OpDef("HARD_SWISH", _hard_swish, OptionsSpec("HardSwishOptions"),
          runtime_versions=("1.15.0",), quantized=activation_kernels.HARD_SWISH,
          quantization=own(types=INT8_ONLY)),
    OpDef("SOFTMAX", _float_only(softmax, last_axis=True), OptionsSpec("SoftmaxOptions", {"beta": 0.0}), _int16_8(3, 2), 4,
          runtime_versions=("1.5.0", "1.14.0", "2.3.0", UNLISTED), quantized=softmax_kernels.SOFTMAX,
          quantization=fixed((1 / 256, -128), (1 / 32768, 0))),
    OpDef("LOG_SOFTMAX", _float_only(log_softmax, last_axis=True), OptionsSpec("LogSoftmaxOptions"), _log_softmax_version, 2,
          runtime_versions=("1.14.0", "1.14.0"), quantized=softmax_kernels.LOG_SOFTMAX,
          quantization=fixed((16 / 256, 127)), types=takes("float32 int8 uint8 int16")),
    OpDef("L2_NORMALIZATION", _float_only(l2_normalization, last_axis=True),
          OptionsSpec("L2NormOptions", {"fused_activation_function": Activation.NONE}),
          _l2_version, 2,
          runtime_versions=("1.5.0", "1.14.0"), quantized=activation_kernels.L2_NORMALIZATION,
          quantization=fixed((1 / 128, 0))),
)

__all__ = ["OPS", "erfc", "gelu", "l2_normalization", "log_softmax", "prelu", "softmax"]
