"""XLA's backend table: (op, operand types) -> how to express that op's kernel in JAX.

`LOWERINGS` has the shape of every backend table (kiln.ops.backends): keyed by op name and
the node's operand types (None for float nodes, "int8" / "uint8" / "int16", "hybrid"), each
entry a `Lowering` and an optional check saying which nodes of that key it cannot lower.

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
from typing import Callable, Iterable

import numpy as np

from .. import ops
from ..errors import KilnError
from ..ops.backends import FLOAT, BackendTable, BackendTableError, Entry, key_name
from ..ops.record import KernelCall

#: ``static`` value meaning "every operand": the op's output shape depends on its values
#: (WHERE, UNIQUE, ...), so it is only computed while tracing, from static inputs.
ALL_STATIC = "all"
#: The integer operand types (`register_lowering`'s ``types`` for a lowering of the codes).
CODES = ("int8", "uint8", "int16")


class LoweringError(KilnError):
    """The lowering table was used wrongly (unknown op, registered twice)."""


@dataclass(frozen=True)
class Lowering:
    """How XLA runs the nodes of one (op, operand types) entry."""

    op_name: str
    fn: Callable
    static: tuple[int, ...] | str = ()

    @property
    def state(self) -> tuple[int, ...]:
        """The op record's ``state_operands``: variable tensors the op reads and updates. As
        the reference kernel, the lowering returns their new values after its outputs."""
        return ops.require(self.op_name).state_operands

    def static_operands(self, n_inputs: int) -> tuple[int, ...]:
        if self.static == ALL_STATIC:
            return tuple(range(n_inputs))
        return tuple(i for i in self.static if i < n_inputs)

    def lower(self, call, *inputs):
        return self.fn(call, *inputs)


@dataclass
class LoweringCall(KernelCall):
    """What a lowering is handed about its node: the reference kernels' KernelCall (options,
    node, output types, operands' quantization), with the partition's label for messages."""

    label: str = ""


#: What XLA lowers, per (op, operand types).
LOWERINGS: BackendTable[Lowering] = BackendTable("xla")
_BUILTINS_LOADED = False


def _with_options(check: Callable) -> Callable:
    """A lowering check ``check(op, opts)`` as the table's ``check(op)``."""
    def check_node(op) -> str | None:
        return check(op, node_options(op))
    return check_node


def register_lowering(op_name: str, fn: Callable, *, types: Iterable[str | None] = (FLOAT,),
                      static: tuple[int, ...] | str = (), check: Callable | None = None) -> Callable:
    """Lower builtin op ``op_name``'s nodes with operand types ``types`` (default: float
    nodes) by ``fn``; ``check(op, opts) -> reason | None`` names the nodes it does not cover.
    Refuses unknown ops and a second registration of a key."""
    if ops.get(op_name) is None:
        raise LoweringError(f"register_lowering: kiln has no op record for {op_name!r}; lowerings "
                            "mirror reference kernels, so the op must exist in kiln.ops first")
    keys = tuple(types)
    taken = [k for k in keys if (op_name, k) in LOWERINGS]
    if taken:
        have = LOWERINGS[op_name, taken[0]].fn
        raise LoweringError(f"register_lowering: {op_name} with {key_name(taken[0])} operands already has a "
                            f"lowering ({have.__module__}.{have.__qualname__})")
    try:
        LOWERINGS.register(op_name, Lowering(op_name, fn, static), types=keys,
                           check=None if check is None else _with_options(check))
    except BackendTableError as exc:
        raise LoweringError(f"register_lowering: {exc}") from None
    return fn


def all_of(*checks: Callable | None) -> Callable:
    """One check ``(op, opts) -> reason | None`` running ``checks`` in order (the first reason wins)."""
    def check(op, opts) -> str | None:
        for fn in checks:
            reason = None if fn is None else fn(op, opts)
            if reason is not None:
                return reason
        return None
    return check


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
            lower_quant_activations,
            lower_quant_lstm,  # noqa: F401 - after lower_rnn: adds to its LSTM lowering
            lower_quant_ops,
            lower_rnn,
            lower_seq,
            lower_shape,
            lower_vars,
        )

        lower_quant_activations.register()  # these add quantized lowerings to the modules' above,
        lower_quant_ops.register()   # derived ones last: to (op, types) given none before
        _BUILTINS_LOADED = True


def get_lowering(op_name: str, types: str | None = FLOAT) -> Lowering | None:
    """The lowering of ``op_name``'s nodes with operand types ``types`` (None: none)."""
    _load_builtins()
    return LOWERINGS.get(op_name, types)


def lowering_for(op) -> Entry[Lowering] | None:
    """The table's entry for node ``op`` (its op and operand types), None without one."""
    _load_builtins()
    return LOWERINGS.entry_for(op)


def lowered_ops() -> list[str]:
    """The ops with a lowering for some operand types."""
    _load_builtins()
    return LOWERINGS.ops()


def node_options(op) -> SimpleNamespace:
    """The node's options with schema defaults: the one place the backend reads op options."""
    return ops.require(op.op_type).make_options(op.options)


def make_call(op, label: str) -> LoweringCall:
    out_dtypes = [None if t is None else np.dtype(t.dtype.numpy) for t in op.outputs]
    return LoweringCall(node_options(op), op, out_dtypes, label=label)


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
