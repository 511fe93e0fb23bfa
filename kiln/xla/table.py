"""XLA's backend table: (op, operand types) -> how to express that op's kernel in JAX.

`LOWERINGS` has the shape of every backend table (kiln.ops.backends): keyed by op name and
the node's operand types (None for float nodes, "int8" / "uint8" / "int16", "hybrid"), each
entry a `Lowering` (kiln/xla/lowering.py) and an optional check saying which nodes of that
key it cannot lower.

`fill` is the one function that puts kiln's lowerings in it: the rows each lower_* module
declares, the gap rows (quantized forms of ops taking only keys no plain row lowers), then
every op whose quantized kernel is its float kernel run on the codes. `XlaDelegate`, `to_jax`
and the lookups below call it (JAX is imported then, not when kiln.xla is); registering a
lowering of one's own needs no JAX.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .. import ops
from ..ops.backends import FLOAT, BackendTableError, Entry, key_name
from .lowering import (
    ALL_STATIC,
    CODES,
    LOWERINGS,
    Lowering,
    LoweringCall,
    LoweringError,
    Row,
    all_of,
    make_call,
    node_options,
)

_FILLED = False


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


def _codes_check(op, opts) -> str | None:
    """None when the node's quantized kernel is the op's float kernel run on the codes."""
    if ops.states(op.op_type, "reads_shape_only"):
        return None
    record = ops.require(op.op_type)
    key = ops.record.operand_types(op)
    if record.quantized.get(key) is not record.kernel:
        return f"{op.name}: its {key} kernel is not the float kernel on the codes, and has no lowering"
    return None


def _register_gap(row: Row, free: Iterable[str | None]) -> None:
    base = LOWERINGS.entry(row.op_name, FLOAT)
    first = base.check if row.float_check and base is not None and base.check is not None else None
    register_lowering(row.op_name, row.fn, types=tuple(free), static=base.value.static if base is not None else (),
                      check=all_of(None if first is None else (lambda op, opts: first(op)), row.check))


def fill():
    """Put kiln's lowerings in `LOWERINGS` (once; JAX is imported here): every lower_* module's
    rows, then the gap rows, then the float lowering of each op whose quantized kernel is its
    float kernel on the codes, for the integer keys nothing else lowers."""
    global _FILLED
    if _FILLED:
        return LOWERINGS
    from ._jax import require_jax

    require_jax()
    from ..kernels import float_math
    from . import (
        lower_control,
        lower_families,
        lower_math,
        lower_nn,
        lower_quant,
        lower_quant_activations,
        lower_quant_lstm,
        lower_quant_ops,
        lower_seq,
        lower_shape,
        lower_vars,
    )

    float_math.ARITHMETIC["jax.numpy"] = lower_families.FLOAT32   # the families' float32 steps under XLA
    rows = [row for module in (lower_control, lower_families, lower_math, lower_nn, lower_quant, lower_quant_activations,
                               lower_quant_lstm, lower_quant_ops, lower_seq, lower_shape, lower_vars)
            for row in module.ROWS]
    for row in rows:
        if not row.gap:
            register_lowering(row.op_name, row.fn, types=row.types, static=row.static, check=row.check)
    for row in rows:
        if row.gap:
            free = [k for k in row.types if (row.op_name, k) not in LOWERINGS]
            if free:
                _register_gap(row, free)
    for name in LOWERINGS.ops():
        record = ops.get(name)
        if LOWERINGS.entry(name, FLOAT) is None or record is None:
            continue
        keys = [k for k in CODES if k in record.quantized and (name, k) not in LOWERINGS
                and (record.reads_shape_only or record.quantized[k] is record.kernel)]
        if keys:
            _register_gap(Row(name, LOWERINGS[name, FLOAT].fn, tuple(keys), (), _codes_check, True, True), keys)
    _FILLED = True
    return LOWERINGS


def get_lowering(op_name: str, types: str | None = FLOAT) -> Lowering | None:
    """The lowering of ``op_name``'s nodes with operand types ``types`` (None: none)."""
    return fill().get(op_name, types)


def lowering_for(op) -> Entry[Lowering] | None:
    """The table's entry for node ``op`` (its op and operand types), None without one."""
    return fill().entry_for(op)


def lowered_ops() -> list[str]:
    """The ops with a lowering for some operand types."""
    return fill().ops()


__all__ = ["ALL_STATIC", "CODES", "LOWERINGS", "Lowering", "LoweringCall", "LoweringError", "fill", "get_lowering",
           "lowered_ops", "lowering_for", "make_call", "register_lowering"]
