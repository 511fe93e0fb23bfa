"""Random ops: RandomUniform, RandomStandardNormal, Multinomial (also what ``tf.nn.dropout``
leaves in a graph). The seed attributes go to the op's options as TF's converter writes
them (TensorFlow puts its graph seed, 87654321 when none is set, in ``seed`` and the op's
own in ``seed2``; both 0 draw fresh seeds in every interpreter). The ops are stateful, so
nothing folds or merges them. Other TF random ops (stateless, truncated normal, integer
uniform) have no builtin, as in TF's converter.
"""

from __future__ import annotations

from ...schema import DType
from ..context import EmitContext
from .common import as_int32, emitter_table

EMITTERS, emits = emitter_table()

_DRAWS = {"RandomUniform": "RANDOM_UNIFORM", "RandomStandardNormal": "RANDOM_STANDARD_NORMAL"}


def _seeds(ctx: EmitContext) -> dict:
    return {"seed": int(ctx.attr("seed", 0)), "seed2": int(ctx.attr("seed2", 0))}


@emits(*_DRAWS)
def emit_random(ctx: EmitContext):
    if ctx.out_dtype(0) != DType.FLOAT32:
        raise ctx.fail(f"{ctx.out_dtype(0).name.lower()} draws have no builtin (float32 only)")
    return ctx.emit1(_DRAWS[ctx.type], [as_int32(ctx, 0, "shape")], **_seeds(ctx))


@emits("Multinomial")
def emit_multinomial(ctx: EmitContext):
    logits = ctx.input(0)
    if logits.dtype != DType.FLOAT32:
        raise ctx.fail(f"{logits.dtype.name.lower()} logits have no builtin (float32 only)")
    return ctx.emit1("MULTINOMIAL", [logits, as_int32(ctx, 1, "num_samples")], **_seeds(ctx))


__all__ = ["EMITTERS"]
