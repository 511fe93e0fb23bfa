"""Op family: random numbers — RANDOM_UNIFORM, RANDOM_STANDARD_NORMAL, MULTINOMIAL.

LiteRT draws from TensorFlow's Philox-4x32-10 generator, one per node, started from the
node's ``seed`` / ``seed2`` options (both 0: seeds drawn from the system's entropy, so
every interpreter differs) when the node is prepared, and advanced by each invoke, so two
invokes give different numbers and a seeded model gives the same sequence in every new
interpreter. kiln's kernels run the same generator, so a seeded node gives LiteRT's
numbers (uniform bit for bit; normal to float rounding of sin / cos / log).

These kernels are the one exception to "a kernel keeps nothing between calls": a node's
generator position lives in the interpreter (``call.runtime.random_streams``, keyed by the
node; restarted when the interpreter re-prepares after a resize, as LiteRT's Prepare
does). Without an interpreter (shape inference) a call starts from the seeds. The records
are ``stateful``: never folded or merged.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..errors import OpError
from .record import KernelCall, OpDef, OptionsSpec
from .shape import int_scalar, int_values

_M32, _M64 = 0xFFFFFFFF, (1 << 64) - 1
_ROUND_MUL = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_KEY_STEP = (0x9E3779B9, 0xBB67AE85)


def philox_blocks(key: int, counter: int, n: int) -> np.ndarray:
    """``n`` Philox-4x32-10 outputs (uint32 [n, 4]) for 128-bit counters counter..counter+n-1."""
    lo = np.uint64(counter & _M64) + np.arange(n, dtype=np.uint64)
    hi = np.uint64((counter >> 64) & _M64) + (lo < np.uint64(counter & _M64)).astype(np.uint64)
    m32, s32 = np.uint64(_M32), np.uint64(32)
    c = [lo & m32, lo >> s32, hi & m32, hi >> s32]
    k = [key & _M32, (key >> 32) & _M32]
    for _ in range(10):
        p0, p1 = _ROUND_MUL[0] * c[0], _ROUND_MUL[1] * c[2]
        c = [(p1 >> s32) ^ c[1] ^ np.uint64(k[0]), p1 & m32, (p0 >> s32) ^ c[3] ^ np.uint64(k[1]), p0 & m32]
        k = [(k[0] + _KEY_STEP[0]) & _M32, (k[1] + _KEY_STEP[1]) & _M32]
    return np.stack(c, axis=-1).astype(np.uint32)


def _stream(call: KernelCall) -> tuple[int, int]:
    """The node's (key, counter): its stored position, else a start from its seeds."""
    streams = getattr(call.runtime, "random_streams", None)
    if streams is not None and id(call.op) in streams:
        return streams[id(call.op)]
    seed, seed2 = int(call.opts.seed), int(call.opts.seed2)
    if seed == 0 and seed2 == 0:
        seed, seed2 = secrets.randbits(64), secrets.randbits(64)
    return seed & _M64, (seed2 & _M64) << 64


def _draw(call: KernelCall, words: int, advance: int | None = None) -> np.ndarray:
    """``words`` 32-bit words from the node's stream; the stream moves on by the blocks used
    (or by ``advance`` blocks)."""
    key, counter = _stream(call)
    blocks = -(-words // 4)
    if call.runtime is not None and hasattr(call.runtime, "random_streams"):
        step = blocks if advance is None else advance
        call.runtime.random_streams[id(call.op)] = (key, (counter + step) % (1 << 128))
    return philox_blocks(key, counter, blocks).reshape(-1)[:words]


def _unit_floats(words: np.ndarray) -> np.ndarray:
    """[0, 1) floats from the low 23 bits of each word (TF's Uint32ToFloat)."""
    return ((words & np.uint32(0x7FFFFF)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


def _out_shape(call: KernelCall, shape: np.ndarray) -> list[int]:
    if shape.dtype != np.int32 or shape.ndim != 1:
        raise OpError(f"{call.op.op_type}: shape must be an int32 vector, got {shape.dtype} {list(shape.shape)}")
    dims = int_values(shape, call.op.op_type, "shape")
    if any(d < 0 for d in dims):
        raise OpError(f"{call.op.op_type}: shape {dims} must be non-negative")
    return dims


def _float_output(call: KernelCall) -> None:
    if call.out_dtypes and call.out_dtypes[0] not in (None, np.dtype(np.float32)):
        raise OpError(f"{call.op.op_type}: output type {call.out_dtypes[0]} is not supported (float32)")


def _random_uniform(call: KernelCall, shape):
    dims = _out_shape(call, shape)
    _float_output(call)
    return _unit_floats(_draw(call, int(np.prod(dims)))).reshape(dims)


def _random_standard_normal(call: KernelCall, shape):
    """Box-Muller on word pairs, in float32 as TF's BoxMullerFloat."""
    dims = _out_shape(call, shape)
    _float_output(call)
    size = int(np.prod(dims))
    words = _draw(call, size + size % 2)
    u1 = np.maximum(_unit_floats(words[0::2]), np.float32(1e-7))
    v1 = (2 * np.pi * _unit_floats(words[1::2]).astype(np.float64)).astype(np.float32)
    with np.errstate(divide="ignore"):
        radius = np.sqrt(np.float32(-2) * np.log(u1))
    out = np.empty(size + size % 2, np.float32)
    out[0::2], out[1::2] = np.sin(v1) * radius, np.cos(v1) * radius
    return out[:size].reshape(dims)


def _multinomial(call: KernelCall, logits, num_samples):
    """Categorical draws per row, non-finite logits weighing nothing (LiteRT's kernel)."""
    if logits.dtype != np.float32 or logits.ndim != 2 or logits.shape[1] == 0:
        raise OpError(f"MULTINOMIAL: logits must be float32 [batch, classes > 0], got {logits.dtype} "
                      f"{list(logits.shape)}")
    if num_samples.dtype != np.int32 or num_samples.ndim != 0:
        raise OpError(f"MULTINOMIAL: num_samples must be an int32 scalar, got {num_samples.dtype} "
                      f"{list(num_samples.shape)}")
    n, batch = int_scalar(num_samples, "MULTINOMIAL", "num_samples"), logits.shape[0]
    if n < 0:
        raise OpError(f"MULTINOMIAL: num_samples {n} must be non-negative")
    out_type = call.out_dtypes[0] if call.out_dtypes and call.out_dtypes[0] is not None else np.dtype(np.int64)
    if out_type not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise OpError(f"MULTINOMIAL: output type {out_type} is not supported (int32, int64)")
    words = _draw(call, 2 * batch * n, advance=batch * (-(-n // 4) * 4) * 2 * 256).astype(np.uint64)
    mantissa = ((words[0::2] & np.uint64(0xFFFFF)) << np.uint64(32)) | words[1::2]
    uniform = (mantissa | np.uint64(1023 << 52)).view(np.float64).reshape(batch, n) - 1.0
    finite = np.isfinite(logits)
    top = np.max(np.where(finite, logits, np.finfo(np.float32).min), axis=1, keepdims=True).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        cdf = np.cumsum(np.where(finite, np.exp(logits - top), 0.0), axis=1)
    out = np.empty((batch, n), out_type)
    for row in range(batch):
        out[row] = np.searchsorted(cdf[row], uniform[row] * cdf[row, -1], side="right")
    return out


_SEEDS = OptionsSpec("RandomOptions", {"seed": 0, "seed2": 0})

# op_version.cc has no rule for these (version 1); runtime_version.cc: 2.8.0.
OPS = (
    OpDef("RANDOM_UNIFORM", _random_uniform, _SEEDS, runtime_versions=("2.8.0",), stateful=True),
    OpDef("RANDOM_STANDARD_NORMAL", _random_standard_normal, _SEEDS, runtime_versions=("2.8.0",),
          stateful=True),
    OpDef("MULTINOMIAL", _multinomial, _SEEDS, runtime_versions=("2.8.0",), stateful=True),
)

__all__ = ["OPS", "philox_blocks"]
