"""LiteRT's float32 transcendental functions, as its x86-64 Linux build computes them.

Where LiteRT's integer kernels build float lookup tables (int8 SOFTMAX's ``expf(−β·s·d)``)
and where its float LSTM steps activate gates, the last bit of a float32 ``exp`` / ``tanh`` /
logistic decides a rounding; NumPy's float32 ``exp`` differs from glibc's ``expf`` on 40 % of
inputs and ``np.tanh`` from Eigen's on half of them. Reproduced here, bit for bit:

- `expf`: glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, from ARM's optimized-routines):
  ``x·32/ln2 = k + r``, ``2^(k/32)`` from a 32-entry table of doubles, a cubic in ``r``, all
  in float64, rounded once to float32 (measured against the C library's expf on 600,000
  inputs: 0 differ).
- `tanh`, `logistic`: Eigen's (LiteRT's tensor_utils ApplyTanhToVector /
  ApplySigmoidToVector and its optimized float TANH / LOGISTIC ops map a buffer as an Eigen
  array). EIGEN_FAST_MATH, SSE packets of 4 floats, no FMA: measured bit for bit against
  ai-edge-litert's TANH and LOGISTIC over 600,000 inputs. tanh is one function for packets
  and scalars. logistic is not: elements Eigen handles one at a time — before the buffer's
  first 16-byte-aligned float and after its last whole packet — go through
  ``expf(x) / (1 + expf(x))``. `logistic` takes the buffer's alignment phase to split them.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
PACKET = 4   # SSE Packet4f: 16-byte alignment

# glibc's expf: 2^(i/32) as doubles less i·2^47 (so adding k·2^47 scales by 2^(k//32)), the
# cubic's coefficients pre-scaled by 1/32^n, 32/ln2, and the round-to-integer shift.
_EXPF_N = 32
_EXPF_TABLE = np.array([np.float64(2.0 ** (i / _EXPF_N)).view(np.uint64) - (i << 47) for i in range(_EXPF_N)],
                       np.uint64)
_EXPF_C = (float.fromhex("0x1.c6af84b912394p-5") / _EXPF_N ** 3, float.fromhex("0x1.ebfce50fac4f3p-3") / _EXPF_N ** 2,
           float.fromhex("0x1.62e42ff0c52d6p-1") / _EXPF_N)
_EXPF_INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * _EXPF_N
_EXPF_SHIFT = float.fromhex("0x1.8p+52")
_EXPF_OVERFLOW, _EXPF_UNDERFLOW = float.fromhex("0x1.62e42ep6"), float.fromhex("-0x1.9fe368p6")


def expf(x: np.ndarray) -> np.ndarray:
    """glibc's expf of float32 ``x`` (overflow to inf above 88.72, 0 below -103.97)."""
    xd = np.asarray(x, F32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z = _EXPF_INV_LN2_N * xd
        shifted = z + _EXPF_SHIFT
        k = np.nan_to_num(shifted, nan=_EXPF_SHIFT, posinf=_EXPF_SHIFT, neginf=_EXPF_SHIFT).view(np.uint64)
        r = z - (shifted - _EXPF_SHIFT)
        s = (_EXPF_TABLE[(k % np.uint64(_EXPF_N)).astype(np.intp)] + (k << np.uint64(47))).view(np.float64)
        y = (_EXPF_C[0] * r + _EXPF_C[1]) * (r * r) + (_EXPF_C[2] * r + 1.0)
        out = (y * s).astype(F32)
    # glibc's special cases: huge arguments saturate, NaN stays NaN
    out = np.where(xd > _EXPF_OVERFLOW, np.inf, out)
    out = np.where(xd < _EXPF_UNDERFLOW, 0.0, out)
    return np.where(np.isnan(xd), np.nan, out).astype(F32)


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
    e = expf(np.minimum(x, _EXP_HI))
    with np.errstate(over="ignore", invalid="ignore"):
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
