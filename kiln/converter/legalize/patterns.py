"""TF-level patterns: groups of TF ops that legalise to one builtin as a whole.

Some activations reach the graph already decomposed — GELU as ``0.5 * x * erfc(-x / sqrt 2)``
(whose Erfc has no builtin), hard-swish as ``x * relu6(x + 3) / 6``, ``tf.math.l2_normalize`` as
``x * rsqrt(max(sum(x^2), eps))``, a variance's ``square(x - mean)``. A pattern matches such a
group at its last op (the anchor); the anchor then emits the builtin, and the interior ops are
skipped — so an Erfc that only feeds a GELU never needs a legalisation of its own. A pattern's
``check`` may still decline a match, with the reason (TF's converter's own conditions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...rules import Rule
from ..context import EmitContext
from ..scope import Pending
from ..tfutil import tf

_COMMUTATIVE = {"Mul", "AddV2", "Add", "Maximum"}


@dataclass(frozen=True)
class C:
    """A constant leaf (every element close to ``value``)."""

    value: float


@dataclass
class Pattern:
    name: str
    tree: Any
    emit: Callable[[EmitContext, dict], Any]
    #: (binds, matched TF ops) -> why the match must not be fused (None: it may).
    check: Callable[[dict, list], str | None] | None = None


def _const_of(t):
    while t.op.type == "Identity":
        t = t.op.inputs[0]
    if t.op.type != "Const":
        return None
    return tf().make_ndarray(t.op.get_attr("value"))


def _match(spec, t, binds: dict, ops: list) -> bool:
    if isinstance(spec, str):
        bound = binds.get(spec)
        if bound is None:
            binds[spec] = t
            return True
        return bound is t or bound.name == t.name
    if isinstance(spec, C):
        value = _const_of(t)
        return value is not None and value.size > 0 and bool(np.allclose(value, spec.value, rtol=1e-4, atol=1e-6))
    types, *args = spec
    types = (types,) if isinstance(types, str) else types
    op = t.op
    if op.type not in types or len(op.inputs) != len(args):
        return False
    orders = [list(op.inputs)]
    if op.type in _COMMUTATIVE and len(args) == 2:
        orders.append(list(reversed(op.inputs)))
    for inputs in orders:
        trial_binds, trial_ops = dict(binds), []
        if all(_match(a, x, trial_binds, trial_ops) for a, x in zip(args, inputs)):
            binds.clear()
            binds.update(trial_binds)
            ops.append(op)
            ops.extend(trial_ops)
            return True
    return False


def _gelu(approximate: bool):
    def emit(ctx: EmitContext, binds: dict):
        x = ctx.scope.lookup(binds["x"])
        return ctx.emit1("GELU", [x], approximate=approximate)

    return emit


def _hard_swish(ctx: EmitContext, binds: dict):
    return ctx.emit1("HARD_SWISH", [ctx.scope.lookup(binds["x"])])


def _prelu(ctx: EmitContext, binds: dict):
    return ctx.emit1("PRELU", [ctx.scope.lookup(binds["x"]), ctx.scope.lookup(binds["alpha"])])


def _squared_difference(ctx: EmitContext, binds: dict):
    return ctx.emit1("SQUARED_DIFFERENCE", [ctx.scope.lookup(binds["a"]), ctx.scope.lookup(binds["b"])])


def _float32(binds: dict, matched: list) -> str | None:
    return None if binds["x" if "x" in binds else "a"].dtype.name == "float32" else "the operands are not float32"


def _l2_normalization(ctx: EmitContext, binds: dict):
    return ctx.emit1("L2_NORMALIZATION", [ctx.scope.lookup(binds["x"])])


def _l2_check(binds: dict, matched: list) -> str | None:
    """TF's converter fuses when the sum runs over the last axis only (LiteRT's kernel
    normalizes along it), keeps its dims, and any epsilon is a scalar below 1e-3 (LiteRT's
    kernel divides by max(norm, 1e-6): sqrt of TF's default 1e-12)."""
    x = binds["x"]
    if x.dtype.name != "float32" or x.shape.rank is None:
        return "the input is not a float32 tensor of known rank"
    axis = _const_of(binds["axis"])
    if axis is None or axis.size != 1 or int(axis.reshape(-1)[0]) not in (-1, x.shape.rank - 1):
        return "the sum does not run over the last axis alone"
    if not all(op.get_attr("keep_dims") for op in matched if op.type == "Sum"):
        return "the sum does not keep its dims"
    if "eps" in binds:
        eps = _const_of(binds["eps"])
        if eps is None or eps.size != 1 or not abs(float(eps.reshape(-1)[0])) < 1e-3:
            return "the epsilon is not a constant scalar below 1e-3"
    return None


_RELU6_X3 = ("Relu6", ("AddV2", "x", C(3.0)))
_SUM_SQ = ("Sum", ("Square", "x"), "axis")
PATTERNS = [
    # tf.nn.gelu(approximate=False): 0.5 * x * erfc(-x * 1/sqrt(2))
    Pattern("gelu", ("Mul", ("Mul", C(0.5), "x"), ("Erfc", ("Mul", ("Neg", "x"), C(0.7071067811865476)))),
            _gelu(False)),
    # 0.5 * x * (1 + erf(x / sqrt(2)))
    Pattern("gelu", ("Mul", ("Mul", C(0.5), "x"), ("AddV2", C(1.0), ("Erf", ("Mul", "x", C(0.7071067811865476))))),
            _gelu(False)),
    Pattern("gelu", ("Mul", ("Mul", C(0.5), "x"), ("AddV2", C(1.0), ("Erf", ("RealDiv", "x", C(1.4142135623730951))))),
            _gelu(False)),
    # tf.nn.gelu(approximate=True): 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    Pattern("gelu_tanh", ("Mul", ("Mul", C(0.5), "x"), ("AddV2", C(1.0), ("Tanh", ("Mul", C(0.7978845608028654), (
        "AddV2", "x", ("Mul", C(0.044715), ("Pow", "x", C(3.0)))))))), _gelu(True)),
    # keras hard_swish: x * (relu6(x + 3) / 6), and the usual variants
    Pattern("hard_swish", ("Mul", "x", ("RealDiv", _RELU6_X3, C(6.0))), _hard_swish),
    Pattern("hard_swish", ("Mul", "x", ("Mul", _RELU6_X3, C(1.0 / 6.0))), _hard_swish),
    Pattern("hard_swish", ("RealDiv", ("Mul", "x", _RELU6_X3), C(6.0)), _hard_swish),
    Pattern("hard_swish", ("Mul", ("Mul", "x", _RELU6_X3), C(1.0 / 6.0)), _hard_swish),
    # keras PReLU: relu(x) - alpha * relu(-x)
    Pattern("prelu", ("AddV2", ("Relu", "x"), ("Mul", ("Neg", "alpha"), ("Relu", ("Neg", "x")))), _prelu),
    Pattern("prelu", ("Sub", ("Relu", "x"), ("Mul", "alpha", ("Relu", ("Neg", "x")))), _prelu),
    # tf.math.reduce_variance / reduce_std, Keras LayerNormalization: square(x - mean), one op in TFLite
    Pattern("squared_difference", ("Square", ("Sub", "a", "b")), _squared_difference, _float32),
    # tf.math.l2_normalize: x * rsqrt(max(sum(x^2), eps)), and the forms TF's converter fuses too
    *[Pattern("l2_normalization", (scale, "x", (root, norm)), _l2_normalization, _l2_check)
      for scale, root in (("Mul", "Rsqrt"), ("RealDiv", "Sqrt"))
      for norm in (("Maximum", _SUM_SQ, "eps"), ("AddV2", _SUM_SQ, "eps"), _SUM_SQ)],
]
_ANCHORS = {p.tree[0] for p in PATTERNS}


@dataclass(frozen=True)
class _Site:
    """A candidate anchor and the names of the ops still to import (the live graph)."""

    op: Any
    live: frozenset


@dataclass(frozen=True)
class _Claim:
    """A fired pattern: what the anchor emits, and the interior ops it makes redundant."""

    pending: Pending
    interior: frozenset


def pattern_rule(pattern: Pattern) -> Rule:
    """``pattern`` as a `kiln.rules.Rule`: match = the tree matches at the anchor, check = no
    interior op is read outside the match, rewrite = claim the anchor (and skip the interior)."""

    def match(site: _Site):
        binds: dict = {}
        matched: list = []
        if not _match(pattern.tree, site.op.outputs[0], binds, matched):
            return None
        return site, binds, matched

    def check(m) -> str | None:
        site, binds, matched = m
        shared = _shared(matched, site.op, {o.name for o in matched} | {site.op.name}, site.live)
        if shared is not None:
            return f"the matched op {shared!r} is also read outside the pattern"
        return pattern.check(binds, matched) if pattern.check is not None else None

    def claim(m) -> _Claim:
        site, binds, matched = m
        return _Claim(Pending(lambda ctx: pattern.emit(ctx, binds), pattern.name),
                      frozenset(o.name for o in matched if o.name != site.op.name and o.type != "Const"))

    return Rule(pattern.name, "legalize", match, claim, check=check, subject=lambda m: m[0].op.name,
                detail=lambda m: f"{m[0].op.name}: matched as {pattern.name}")


RULES = [pattern_rule(p) for p in PATTERNS]


def match_patterns(scope, ops) -> tuple[dict, set]:
    """Apply the pattern rules over ``ops`` (topological order), last op first; the first
    rule that fires at an anchor claims it.

    Returns (anchor op name -> Pending, names of interior ops to skip).
    """
    claimed: dict[str, Pending] = {}
    tracer = scope.importer.stats.tracer
    skipped: set[str] = set()
    live = frozenset(op.name for op in ops)
    for op in reversed(ops):
        if op.type not in _ANCHORS or op.name in skipped or len(op.outputs) != 1:
            continue
        site = _Site(op, live)
        for rule in RULES:
            fired = rule.apply(site, tracer)
            if fired:
                claimed[op.name] = fired.pending
                skipped |= fired.interior
                break
    return claimed, skipped


def _shared(matched, anchor, names: set, live: set) -> str | None:
    """The first interior op that also feeds ops outside the match (then it is needed anyway
    and the pattern does not apply), else None."""
    for o in matched:
        if o is anchor or o.type == "Const":
            continue
        for out in o.outputs:
            for consumer in out.consumers():
                if consumer.name not in names and consumer.name in live:
                    return o.name
    return None
