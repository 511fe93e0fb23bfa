"""Spectral ops: RFFT and RFFT2D, and the complex64 parts COMPLEX_ABS, REAL and IMAG.

TF's converter writes ``tf.signal.rfft`` as RFFT2D over a unit axis (its ConvertRfftToRfft2d:
``[..., n]`` -> ``[..., 1, n]``, fft_length ``[1, n]``, then the unit axis dropped), so
``tf.signal.stft`` becomes RESHAPE, GATHER, RESHAPE, MUL, RESHAPE, RFFT2D, RESHAPE,
COMPLEX_ABS. Complex tensors may flow only into the builtins `COMPLEX_BUILTINS` names (see
kiln/converter/context.py): an Add, a slice or a transpose of complex values stays a TF op, as
with TF's converter.
"""

from __future__ import annotations

import numpy as np

from ...ir import Tensor
from ...schema import DType
from ..context import EmitContext
from .common import as_int32, emitter_table, int32_const, reshape

EMITTERS, emits = emitter_table()


def _real_input(ctx: EmitContext) -> Tensor:
    x = ctx.input(0)
    if x.dtype != DType.FLOAT32:
        raise ctx.fail(f"{x.dtype.name.lower()} input: LiteRT's RFFT2D takes float32 only")
    return x


def _check_lengths(ctx: EmitContext, lengths: Tensor) -> None:
    """Refuse constant fft lengths LiteRT's kernel cannot take (its Prepare fails on lengths
    that are not powers of two, which TF's converter writes anyway) or gets wrong (width 1)."""
    if not lengths.is_constant:
        return
    values = [int(v) for v in np.asarray(lengths.data).reshape(-1)]
    if any(v <= 0 or v & (v - 1) for v in values):
        raise ctx.fail(f"fft_length {values}: LiteRT's RFFT2D takes only powers of two")
    if values[-1] == 1:
        raise ctx.fail("fft_length 1: LiteRT's RFFT2D computes a one-point transform wrongly")


@emits("RFFT2D")
def emit_rfft2d(ctx: EmitContext):
    x = _real_input(ctx)
    lengths = as_int32(ctx, 1, "fft_length")
    _check_lengths(ctx, lengths)
    return ctx.emit1("RFFT2D", [x, lengths])


def _unit_axis_shape(signature, rank: int) -> list[int]:
    sig = list(signature)
    return sig[:rank - 1] + [1] + sig[rank - 1:]


@emits("RFFT")
def emit_rfft(ctx: EmitContext):
    """RFFT2D over a unit axis inserted before the last, as TF's converter writes it: RESHAPE
    in and out where at most one dimension is unknown, else EXPAND_DIMS and SQUEEZE."""
    x = _real_input(ctx)
    rank = ctx.in_rank(0)
    lengths = ctx.emit1("CONCATENATION", [int32_const(ctx, [1], "unit_length"), as_int32(ctx, 1, "fft_length")],
                        ctx.temp("fft_lengths", DType.INT32, (2,)), axis=0, fused_activation_function=0)
    _check_lengths(ctx, lengths)
    in_sig = _unit_axis_shape(ctx.in_signature(0), rank)
    if sum(d < 0 for d in in_sig) <= 1:
        expanded = reshape(ctx, x, in_sig, suffix="expand")
    else:
        expanded = ctx.emit1("EXPAND_DIMS", [x, int32_const(ctx, [rank - 1], "axis")],
                             ctx.temp("expand", x.dtype, in_sig))
    out_sig = ctx.out_signature(0)
    spectrum = ctx.emit1("RFFT2D", [expanded, lengths],
                         ctx.temp("rfft2d", DType.COMPLEX64, _unit_axis_shape(out_sig, rank)))
    if sum(d < 0 for d in out_sig) <= 1:
        return reshape(ctx, spectrum, out_sig, ctx.out(0), suffix="squeeze")
    return ctx.emit1("SQUEEZE", [spectrum], ctx.out(0), squeeze_dims=(rank - 1,))


_PARTS = {"ComplexAbs": "COMPLEX_ABS", "Real": "REAL", "Imag": "IMAG"}


@emits(*_PARTS)
def emit_complex_part(ctx: EmitContext):
    return ctx.emit1(_PARTS[ctx.type], [ctx.input(0)])


@emits("Complex")
def emit_complex(ctx: EmitContext):
    """``tf.complex`` of constants folds to a complex64 constant, as TF's converter folds it;
    LiteRT has no builtin that builds complex values at run time."""
    real, imag = ctx.const(0), ctx.const(1)
    if real is None or imag is None:
        raise ctx.fail("LiteRT has no builtin that builds complex values from tensors")
    if ctx.out_dtype(0) != DType.COMPLEX64:
        raise ctx.fail("complex128: LiteRT's builtins take complex64 only")
    value = np.asarray(real, np.float64) + 1j * np.asarray(imag, np.float64)
    return ctx.constant(value.astype(np.complex64), DType.COMPLEX64, ctx.name)
