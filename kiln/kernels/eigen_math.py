"""Eigen's float32 tanh and logistic, as LiteRT's x86-64 build computes them.

LiteRT's float LSTM steps (tensor_utils ApplyTanhToVector / ApplySigmoidToVector) and its
optimized float TANH / LOGISTIC ops map a buffer as an Eigen array and call ``.tanh()`` /
``.logistic()``. Eigen evaluates them with rational / polynomial approximations in float32
(EIGEN_FAST_MATH, SSE packets of 4 floats, no FMA: measured bit for bit against
ai-edge-litert's TANH and LOGISTIC over 600,000 inputs), not the correctly rounded values:
``np.tanh`` differs from them on half the inputs by an ulp.

tanh is one function for packets and scalars. logistic is not: elements Eigen handles one
at a time — before the buffer's first 16-byte-aligned float and after its last whole
packet — go through ``exp(x) / (1 + exp(x))`` with the C library's expf (here: exp in
float64 rounded to float32, which equals glibc's expf but for about one input in a
thousand, by an ulp). `logistic` takes the buffer's alignment phase to split them.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
PACKET = 4   # SSE Packet4f: 16-byte alignment

_TANH_CLAMP = F32(7.90738964080810547)      # without FMA: the smallest x with tanh(x) == 1
_TANH_ALPHA = tuple(F32(c) for c in (1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1))
_TANH_BETA = tuple(F32(c) for c in (8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1, 1.0))

_EXP_HI, _EXP_LO = F32(16.6355324), F32(-104.0)
_LOG2E = F32(1.44269504088896341)
_C1, _C2 = F32(-0.693359375), F32(2.12194440e-4)
_P2, _P3 = F32(0.49999141693115234375), F32(0.16666877269744873046875)
_P4, _P5 = F32(4.1898667812347412109375e-2), F32(8.33471305668354034423828125e-3)


def _madd(a, b, c):
    """Eigen's pmadd without FMA: a product and a sum, each rounded to float32."""
    return ((a * b).astype(F32) + c).astype(F32)


def _horner(x, coefficients):
    p = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        p = _madd(p, x, c)
    return p


def tanh(x: np.ndarray) -> np.ndarray:
    """Eigen's ptanh_float: a [9/8] rational in x, the input clamped where it reaches ±1."""
    x = np.clip(np.asarray(x, F32), -_TANH_CLAMP, _TANH_CLAMP).astype(F32)
    x2 = (x * x).astype(F32)
    x3 = (x2 * x).astype(F32)
    p = _madd(x3, _horner(x2, _TANH_ALPHA), x)
    with np.errstate(invalid="ignore"):
        return (p / _horner(x2, _TANH_BETA)).astype(F32)


def _logistic_packet(x: np.ndarray) -> np.ndarray:
    """Eigen's scalar_logistic_op<float>::packetOp: exp(x/2) by Cephes' range reduction and a
    degree-5 polynomial, squared, then e / (1 + e)."""
    zero = x < _EXP_LO
    half = (np.minimum(x, _EXP_HI) * F32(0.5)).astype(F32)
    m = np.floor(_madd(half, _LOG2E, F32(0.5))).astype(F32)
    r = _madd(m, _C1, half)
    r = _madd(m, _C2, r)
    r2 = (r * r).astype(F32)
    p = _madd(r, _madd(r2, _P5, _P3), _madd(r2, _P4, _P2))
    p = _madd(r2, p, (r + F32(1)).astype(F32))
    with np.errstate(over="ignore", invalid="ignore"):
        e = (p * np.exp2(np.maximum(m, F32(-126))).astype(F32)).astype(F32)   # pldexp: exact scaling
        e = (e * e).astype(F32)
        return np.where(zero, F32(0), (e / (F32(1) + e)).astype(F32)).astype(F32)


def _logistic_scalar(x: np.ndarray) -> np.ndarray:
    """Eigen's scalar path: expf(min(x, hi)) / (1 + expf(...))."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(np.minimum(x, _EXP_HI).astype(np.float64)).astype(F32)
        return (e / (F32(1) + e)).astype(F32)


def scalar_positions(size: int, phase: int) -> np.ndarray:
    """Which of ``size`` floats Eigen handles one at a time in a buffer that starts ``phase``
    floats past a 16-byte boundary (its peeled head and its tail)."""
    head = min(size, (-phase) % PACKET)
    end = head + (size - head) // PACKET * PACKET
    index = np.arange(size)
    return (index < head) | (index >= end)


def logistic(x: np.ndarray, scalar: np.ndarray | None = None) -> np.ndarray:
    """Eigen's float logistic; ``scalar`` (broadcast to ``x``) marks the elements its scalar
    path computes (`scalar_positions`); None: an aligned buffer of ``x.size`` floats."""
    x = np.asarray(x, F32)
    if scalar is None:
        scalar = scalar_positions(x.size, 0).reshape(x.shape)
    return np.where(scalar, _logistic_scalar(x), _logistic_packet(x)).astype(F32)
