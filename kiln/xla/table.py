"""The per-op lowering table: op name -> how to express that op's reference kernel in JAX.

A lowering has the kernel contract of kiln.ops.record (``fn(call, *inputs)`` returning one
array or a tuple), except that inputs may be JAX tracers and the result is built with
jax.numpy / jax.lax. ``static`` names the operand positions that must be known while
tracing (shapes, axes, permutations): XLA compiles static shapes, so a node whose such
operand is computed at run time from non-static values is not claimed.

Registering needs no JAX; the built-in lowerings are loaded (and JAX imported) on first use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from .. import ops
from ..errors import KilnError
from ..ops.record import operand_types

#: ``static`` value meaning "every operand": the op's output shape depends on its values
#: (WHERE, UNIQUE, ...), so it is only computed while tracing, from static inputs.
ALL_STATIC = "all"


class LoweringError(KilnError):
    """The lowering table was used wrongly (unknown op, registered twice)."""


@dataclass(frozen=True)
class QuantizedRule:
    """One entry of an op's quantized dispatch. A node with quantized tensors is lowered by
    the first rule whose ``applies(op)`` holds (None: every such node), with ``fn`` (the
    lowering contract) unless ``check(op, opts)`` gives the reason it cannot be.
    ``float_check``: the op's float ``check`` holds for these nodes too (a float lowering run
    on the codes, or one that handles both)."""

    fn: Callable
    check: Callable | None = None
    applies: Callable | None = None
    float_check: bool = False

    def takes(self, op) -> bool:
        return self.applies is None or bool(self.applies(op))


@dataclass(frozen=True)
class Lowering:
    op_name: str
    #: The lowering of float nodes (and of quantized ones, when a rule names it as its ``fn``).
    fn: Callable
    static: tuple[int, ...] | str = ()
    #: Optional ``check(op, opts) -> reason | None``: cases the lowering does not cover.
    check: Callable | None = None
    #: Ordered rules for nodes with quantized tensors; without any such nodes are refused.
    quantized: tuple[QuantizedRule, ...] = ()

    @property
    def state(self) -> tuple[int, ...]:
        """The op record's ``state_operands``: variable tensors the op reads and updates. As
        the reference kernel, the lowering returns their new values after its outputs."""
        return ops.require(self.op_name).state_operands

    def static_operands(self, n_inputs: int) -> tuple[int, ...]:
        if self.static == ALL_STATIC:
            return tuple(range(n_inputs))
        return tuple(i for i in self.static if i < n_inputs)

    def rule_for(self, op) -> QuantizedRule | None:
        """The quantized rule that lowers ``op`` (None: none applies)."""
        return next((rule for rule in self.quantized if rule.takes(op)), None)

    def lower(self, call, *inputs):
        """Run the node's lowering: its quantized rule's, else the float one."""
        if self.quantized and operand_types(call.op) is not None:
            rule = self.rule_for(call.op)
            if rule is not None:
                return rule.fn(call, *inputs)
        return self.fn(call, *inputs)


@dataclass
class LoweringCall:
    """What a lowering is handed about its node (the KernelCall of the reference kernels)."""

    opts: SimpleNamespace
    op: object
    out_dtypes: list
    label: str

    def in_quant(self, i: int):
        t = self.op.inputs[i]
        return None if t is None else t.quantization

    def out_quant(self, i: int = 0):
        t = self.op.outputs[i]
        return None if t is None else t.quantization


_TABLE: dict[str, Lowering] = {}
_BUILTINS_LOADED = False


def register_lowering(op_name: str, fn: Callable, *, static: tuple[int, ...] | str = (),
                      check: Callable | None = None, quantized: Callable | None = None) -> Callable:
    """Add the lowering of builtin op ``op_name``; refuses unknown ops and a second registration.
    ``quantized``: the check under which ``fn`` lowers nodes with quantized tensors too."""
    if ops.get(op_name) is None:
        raise LoweringError(f"register_lowering: kiln has no op record for {op_name!r}; lowerings "
                            "mirror reference kernels, so the op must exist in kiln.ops first")
    if op_name in _TABLE:
        raise LoweringError(f"register_lowering: {op_name} already has a lowering "
                            f"({_TABLE[op_name].fn.__module__}.{_TABLE[op_name].fn.__qualname__})")
    rules = () if quantized is None else (QuantizedRule(fn, quantized, float_check=True),)
    _TABLE[op_name] = Lowering(op_name, fn, static, check, rules)
    return fn


def add_quantized_rule(op_name: str, fn: Callable, check: Callable | None = None, *,
                       applies: Callable | None = None, float_check: bool = False) -> None:
    """Append a `QuantizedRule` to registered op ``op_name``'s quantized dispatch (rules
    added earlier take precedence); its float lowering is kept for float nodes."""
    base = _TABLE.get(op_name)
    if base is None:
        raise LoweringError(f"add_quantized_rule: {op_name} has no registered lowering to add to")
    rule = QuantizedRule(fn, check, applies, float_check)
    _TABLE[op_name] = dataclasses.replace(base, quantized=(*base.quantized, rule))


def add_quantized_lowering(op_name: str, fn: Callable, check: Callable) -> None:
    """Give ``op_name``, whose float lowering is registered, its one quantized lowering
    (``fn``, same contract, under ``check``), kept in its own module."""
    base = _TABLE.get(op_name)
    if base is None or base.quantized:
        raise LoweringError(f"add_quantized_lowering: {op_name} needs a registered float lowering without "
                            "a quantized one")
    add_quantized_rule(op_name, fn, check, float_check=True)


def lowering(op_name: str, *, static: tuple[int, ...] | str = ()):
    """Decorator form of `register_lowering`."""
    def wrap(fn):
        return register_lowering(op_name, fn, static=static)
    return wrap


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        from ._jax import require_jax

        require_jax()
        from . import (  # noqa: F401 - they register
            lower_control,
            lower_math,
            lower_nn,
            lower_quant,
            lower_quant_lstm,  # noqa: F401 - after lower_rnn: adds to its LSTM lowering
            lower_quant_more,
            lower_quant_ops,
            lower_rnn,
            lower_seq,
            lower_shape,
            lower_vars,
        )

        lower_quant_more.register()  # these two add quantized rules to the lowerings above,
        lower_quant_ops.register()   # on-codes ones last: to ops given no rule before
        _BUILTINS_LOADED = True


def get_lowering(op_name: str) -> Lowering | None:
    _load_builtins()
    return _TABLE.get(op_name)


def lowered_ops() -> list[str]:
    _load_builtins()
    return sorted(_TABLE)


def node_options(op) -> SimpleNamespace:
    """The node's options with schema defaults: the one place the backend reads op options."""
    return ops.require(op.op_type).make_options(op.options)


def make_call(op, label: str) -> LoweringCall:
    out_dtypes = [None if t is None else np.dtype(t.dtype.numpy) for t in op.outputs]
    return LoweringCall(node_options(op), op, out_dtypes, label)


def is_float(dtype) -> bool:
    """Floating point, bfloat16 included (NumPy files bfloat16 under kind 'V')."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def fused_range(act: int, dtype) -> tuple:
    """The fused activation's clamp bounds for ``dtype`` (kiln.ops' activation_range; for
    bfloat16 — the dtype_policy — NONE clamps to bfloat16's own finite range)."""
    from ..ops.elementwise import activation_range

    dtype = np.dtype(dtype)
    if dtype.name != "bfloat16":
        return activation_range(act, dtype)
    import ml_dtypes

    lo, hi = activation_range(act, np.dtype(np.float32))
    info = ml_dtypes.finfo(dtype)
    return max(float(lo), float(info.min)), min(float(hi), float(info.max))


def computed_once(x):
    """``x`` unchanged, as a value XLA computes once and stores.

    Window slices (an im2col's taps, a depthwise convolution's) each read the same padded
    input; XLA's CPU fusion copies a cheap-looking producer into every one of them, so an
    int8 requantization before a 3x3 convolution ran nine times. XLA never duplicates a
    reduction, and the maximum of ``x`` and its type's lowest value is ``x`` exactly (NaN
    stays NaN); ``lax.optimization_barrier`` would not do: XLA's CPU pipeline removes it
    before fusing. Measured (bench/xla_quant_bench.py, bench/xla_bench.py): int8 CNN 1.7x,
    int8 and 16x8 MobileNetV2 1.25x, float CNN / MobileNetV2 at batch 8 1.15-1.2x faster,
    batch 1 float models unchanged.
    """
    import jax.numpy as jnp

    kind = np.dtype(x.dtype)
    lowest = -np.inf if is_float(kind) else np.iinfo(kind).min
    return jnp.max(jnp.stack([x, jnp.full_like(x, lowest)]), axis=0)
