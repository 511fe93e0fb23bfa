"""The per-op lowering table: op name -> how to express that op's reference kernel in JAX.

A lowering has the kernel contract of kiln.ops.record (``fn(call, *inputs)`` returning one
array or a tuple), except that inputs may be JAX tracers and the result is built with
jax.numpy / jax.lax. ``static`` names the operand positions that must be known while
tracing (shapes, axes, permutations): XLA compiles static shapes, so a node whose such
operand is computed at run time from non-static values is not claimed.

Registering needs no JAX; the built-in lowerings are loaded (and JAX imported) on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from .. import ops
from ..errors import KilnError

#: ``static`` value meaning "every operand": the op's output shape depends on its values
#: (WHERE, UNIQUE, ...), so it is only computed while tracing, from static inputs.
ALL_STATIC = "all"


class LoweringError(KilnError):
    """The lowering table was used wrongly (unknown op, registered twice)."""


@dataclass(frozen=True)
class Lowering:
    op_name: str
    fn: Callable
    static: tuple[int, ...] | str = ()
    #: Optional ``check(op, opts) -> reason | None``: cases the lowering does not cover.
    check: Callable | None = None
    #: ``check`` for nodes with quantized tensors; without it such nodes are refused.
    quantized: Callable | None = None

    @property
    def state(self) -> tuple[int, ...]:
        """The op record's ``state_operands``: variable tensors the op reads and updates. As
        the reference kernel, the lowering returns their new values after its outputs."""
        return ops.require(self.op_name).state_operands

    def static_operands(self, n_inputs: int) -> tuple[int, ...]:
        if self.static == ALL_STATIC:
            return tuple(range(n_inputs))
        return tuple(i for i in self.static if i < n_inputs)


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
    """Add the lowering of builtin op ``op_name``; refuses unknown ops and a second registration."""
    if ops.get(op_name) is None:
        raise LoweringError(f"register_lowering: kiln has no op record for {op_name!r}; lowerings "
                            "mirror reference kernels, so the op must exist in kiln.ops first")
    if op_name in _TABLE:
        raise LoweringError(f"register_lowering: {op_name} already has a lowering "
                            f"({_TABLE[op_name].fn.__module__}.{_TABLE[op_name].fn.__qualname__})")
    _TABLE[op_name] = Lowering(op_name, fn, static, check, quantized)
    return fn


def add_quantized_lowering(op_name: str, fn: Callable, check: Callable) -> None:
    """Give ``op_name``, whose float lowering is registered, a lowering for its nodes with a
    quantized input 0 (``fn``, same contract; ``check`` as ``Lowering.quantized``), kept in its
    own module; nodes with float input 0 still run the float lowering."""
    from ..ops.elementwise import is_quantized

    base = _TABLE.get(op_name)
    if base is None or base.quantized is not None:
        raise LoweringError(f"add_quantized_lowering: {op_name} needs a registered float lowering without "
                            "a quantized one")
    float_fn = base.fn

    def dispatch(call, *inputs):
        first = call.op.inputs[0] if call.op.inputs else None
        return (fn if first is not None and is_quantized(first) else float_fn)(call, *inputs)

    _TABLE[op_name] = Lowering(op_name, dispatch, base.static, base.check, check)


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
        from . import (lower_control, lower_math, lower_nn, lower_quant, lower_rnn,  # noqa: F401 - they register
                       lower_seq, lower_shape, lower_vars)
        from . import lower_quant_lstm  # noqa: F401 - after lower_rnn: adds to its LSTM lowering
        from . import lower_quant_more, lower_quant_ops

        lower_quant_ops.register()  # last: it extends the lowerings above to quantized codes
        lower_quant_more.register()
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
