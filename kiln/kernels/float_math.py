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

Each is written once over `Float32`, the float32 arithmetic it needs (each operation rounded
once to float32, as LiteRT's C++ rounds it): NumPy's here; kiln.xla subclasses it for XLA,
whose CPU compiler would otherwise fuse a product into a sum or divide by a constant through
its reciprocal.
"""

from __future__ import annotations

import numpy as np

from ..errors import KilnError

F32 = np.float32
PACKET = 4   # SSE Packet4f: 16-byte alignment


class Float32:
    """float32 arithmetic over array namespace ``xp``, each operation rounded once to float32
    (C's float operations, no fused multiply-add). This class is NumPy's, whose float32
    operations are exactly that; a backend whose compiler contracts or rewrites float
    operations subclasses it (kiln.xla.lower_hybrid). Operands are float32 arrays or scalars."""

    xp = np

    def round(self, x):
        """float64 ``x`` rounded to float32."""
        return x.astype(F32)

    def matmul(self, a, b):
        """A float product (matrix, or a batch of them) as the reference kernels' BLAS call takes it."""
        return self.xp.matmul(a, b)

    def mul(self, a, b):
        return np.multiply(a, b, dtype=F32)

    def div(self, a, b):
        return np.divide(a, b, dtype=F32)

    def add(self, a, b):
        return np.add(a, b, dtype=F32)

    def sub(self, a, b):
        return np.subtract(a, b, dtype=F32)

    def sqrt(self, a):
        return np.sqrt(a, dtype=F32)

    def divide_exactly(self, a, constant: float):
        """float64 ``a / constant``, correctly rounded (a compiler may divide by a constant
        through its reciprocal; NumPy does not)."""
        return a / constant

    def madd(self, a, b, c):
        """Eigen's pmadd without FMA: a product and a sum, each rounded to float32."""
        return self.add(self.mul(a, b), c)

    def sum_last(self, x):
        """The sum over the last axis as a C loop adds it (left to right, float32), kept as an
        axis of 1."""
        return np.cumsum(x, axis=-1, dtype=F32)[..., -1:]

    def recur(self, step, h, xs, *, reverse: bool = False):
        """``h_t = step(h_{t-1}, xs[t])`` over the leading axis of ``xs`` (last to first with
        ``reverse``): (every ``h_t`` stacked, the last ``h``). ``h`` may be a tuple whose first
        array is the output (an LSTM's (h, c)), ``xs`` a tuple of arrays stepped together.
        NumPy loops over time; a traced backend runs it as one loop primitive, compiled once
        whatever the number of steps."""
        pairs, several = isinstance(h, tuple), isinstance(xs, tuple)
        first = h[0] if pairs else h
        steps = len(xs[0]) if several else len(xs)
        out = np.empty((steps,) + np.shape(first), np.result_type(first))
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h = step(h, tuple(a[t] for a in xs) if several else xs[t])
            out[t] = h[0] if pairs else h
        return out, h


#: NumPy's float32 arithmetic, the default of the functions below.
NUMPY = Float32()
#: Array namespace name -> its float32 arithmetic, for namespaces whose compiler needs its own
#: (kiln.xla adds jax.numpy's when it fills its table).
ARITHMETIC: dict[str, Float32] = {}


def arithmetic(xp) -> Float32:
    """The float32 arithmetic over array namespace ``xp`` that rounds as LiteRT's C++ does."""
    if xp is np:
        return NUMPY
    try:
        return ARITHMETIC[xp.__name__]
    except KeyError:
        raise KilnError(f"no float32 arithmetic for array namespace {xp.__name__} (its backend adds one)") from None

# glibc's expf: 2^(i/32) as doubles less i·2^47 (so adding k·2^47 scales by 2^(k//32)), the
# cubic's coefficients pre-scaled by 1/32^n, and 32/ln2.
_EXPF_N = 32
_EXPF_TABLE = np.array([np.float64(2.0 ** (i / _EXPF_N)).view(np.uint64) - (i << 47) for i in range(_EXPF_N)],
                       np.uint64)
_EXPF_C = (float.fromhex("0x1.c6af84b912394p-5") / _EXPF_N ** 3, float.fromhex("0x1.ebfce50fac4f3p-3") / _EXPF_N ** 2,
           float.fromhex("0x1.62e42ff0c52d6p-1") / _EXPF_N)
_EXPF_INV_LN2_N = float.fromhex("0x1.71547652b82fep+0") * _EXPF_N
_EXPF_K_LIMIT = float(1 << 20)
_EXPF_OVERFLOW, _EXPF_UNDERFLOW = float.fromhex("0x1.62e42ep6"), float.fromhex("-0x1.9fe368p6")


def expf(x, f: Float32 = NUMPY):
    """glibc's expf of float32 ``x`` (overflow to inf above 88.72, 0 below -103.97). Its steps are
    float64, which round to the same float32 with or without a fused multiply-add."""
    xp = f.xp
    xd = xp.asarray(x).astype(F32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        z = _EXPF_INV_LN2_N * xd
        # glibc rounds z to the integer k by adding and subtracting 1.5·2^52 and reads k from
        # the sum's bits; rint is the same rounding (to nearest, ties to even), and XLA would
        # fold (z + c) − c to z. Arguments beyond ±2^20 are special cases below.
        kd = xp.rint(xp.nan_to_num(xp.clip(z, -_EXPF_K_LIMIT, _EXPF_K_LIMIT)))
        r = z - kd
        k = kd.astype(np.int64)
        s = (xp.take(_EXPF_TABLE, k & (_EXPF_N - 1)) + (k.astype(np.uint64) << np.uint64(47))).view(np.float64)
        y = (_EXPF_C[0] * r + _EXPF_C[1]) * (r * r) + (_EXPF_C[2] * r + 1.0)
        out = f.round(y * s)
    # glibc's special cases: huge arguments saturate, NaN stays NaN
    out = xp.where(xd > _EXPF_OVERFLOW, F32(np.inf), out)
    out = xp.where(xd < _EXPF_UNDERFLOW, F32(0), out)
    return xp.where(xp.isnan(xd), F32(np.nan), out).astype(F32)


_TANH_CLAMP = F32(7.90738964080810547)      # without FMA: the smallest x with tanh(x) == 1
_TANH_ALPHA = tuple(F32(c) for c in (1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1))
_TANH_BETA = tuple(F32(c) for c in (8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1, 1.0))

_EXP_HI, _EXP_LO = F32(16.6355324), F32(-104.0)
_LOG2E = F32(1.44269504088896341)
_C1, _C2 = F32(-0.693359375), F32(2.12194440e-4)
_P2, _P3 = F32(0.49999141693115234375), F32(0.16666877269744873046875)
_P4, _P5 = F32(4.1898667812347412109375e-2), F32(8.33471305668354034423828125e-3)


def _horner(f: Float32, x, coefficients):
    p = f.madd(coefficients[0], x, coefficients[1])
    for c in coefficients[2:]:
        p = f.madd(p, x, c)
    return p


def tanh(x, f: Float32 = NUMPY):
    """Eigen's ptanh_float: a [9/8] rational in x, the input clamped where it reaches ±1."""
    xp = f.xp
    x = xp.clip(xp.asarray(x).astype(F32), -_TANH_CLAMP, _TANH_CLAMP)
    x2 = f.mul(x, x)
    x3 = f.mul(x2, x)
    p = f.madd(x3, _horner(f, x2, _TANH_ALPHA), x)
    with np.errstate(invalid="ignore"):
        return f.div(p, _horner(f, x2, _TANH_BETA))


def _pow2(xp, m):
    """2^m, exactly, for integer-valued float32 ``m`` in [-126, 127] (Eigen's pldexp here): the
    float32 whose exponent field is m (a library exp2 / ldexp need not be exact)."""
    return ((m.astype(np.int32) + 127) << 23).view(F32)


def _logistic_packet(f: Float32, x):
    """Eigen's scalar_logistic_op<float>::packetOp: exp(x/2) by Cephes' range reduction and a
    degree-5 polynomial, squared, then e / (1 + e)."""
    xp = f.xp
    zero = x < _EXP_LO
    with np.errstate(invalid="ignore"):     # ±inf and NaN: the results are chosen below or stay NaN
        half = f.mul(xp.minimum(x, _EXP_HI), F32(0.5))
        m = xp.floor(f.madd(half, _LOG2E, F32(0.5)))
        r = f.madd(m, _C1, half)
        r = f.madd(m, _C2, r)
        r2 = f.mul(r, r)
        p = f.madd(r, f.madd(r2, _P5, _P3), f.madd(r2, _P4, _P2))
        p = f.madd(r2, p, f.add(r, F32(1)))
        e = f.mul(p, _pow2(xp, xp.clip(xp.nan_to_num(m), F32(-126), F32(127))))    # pldexp: exact scaling
        e = f.mul(e, e)
        return xp.where(zero, F32(0), f.div(e, f.add(F32(1), e)))


def _logistic_scalar(f: Float32, x):
    """Eigen's scalar path: expf(min(x, hi)) / (1 + expf(...))."""
    e = expf(f.xp.minimum(x, _EXP_HI), f)
    with np.errstate(over="ignore", invalid="ignore"):
        return f.div(e, f.add(F32(1), e))


def scalar_positions(size: int, phase: int) -> np.ndarray:
    """Which of ``size`` floats Eigen handles one at a time in a buffer that starts ``phase``
    floats past a 16-byte boundary (its peeled head and its tail)."""
    head = min(size, (-phase) % PACKET)
    end = head + (size - head) // PACKET * PACKET
    index = np.arange(size)
    return (index < head) | (index >= end)


def logistic(x, scalar: np.ndarray | None = None, f: Float32 = NUMPY):
    """Eigen's float logistic; ``scalar`` (broadcast to ``x``) marks the elements its scalar
    path computes (`scalar_positions`); None: an aligned buffer of ``x.size`` floats."""
    xp = f.xp
    x = xp.asarray(x).astype(F32)
    if scalar is None:
        scalar = scalar_positions(x.size, 0).reshape(x.shape)
    if not np.any(scalar):
        return _logistic_packet(f, x)
    return xp.where(scalar, _logistic_scalar(f, x), _logistic_packet(f, x))
