"""What an XLA lowering is and what it may use: the pieces below every lower_* module.

A lowering has the kernel contract of kiln.ops.record (``fn(call, *inputs)`` returning one
array or a tuple), except that inputs may be JAX tracers and the result is built with
jax.numpy / jax.lax. ``static`` names the operand positions that must be known while
tracing (shapes, axes, permutations): XLA compiles static shapes, so a node whose such
operand is computed at run time from non-static values is not claimed.

Each lower_* module declares its table entries as `Rows` (data, nothing registered when it is
imported); kiln/xla/table.py's `fill` puts every module's rows into `LOWERINGS`, once.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Iterable

import numpy as np

from .. import ops
from ..errors import KilnError
from ..ops.backends import FLOAT, BackendTable
from ..ops.record import KernelCall
from ..schema import DType

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


#: What XLA lowers, per (op, operand types): filled by kiln/xla/table.py's `fill`.
LOWERINGS: BackendTable[Lowering] = BackendTable("xla")


@dataclass(frozen=True)
class Row:
    """One table entry a lowering module declares: ``fn`` lowers ``op_name``'s nodes with operand
    types ``types``; ``check(op, opts) -> reason | None`` names the nodes it does not cover.
    A ``gap`` row takes only the keys no plain row lowers, the operands the op's float
    lowering needs static, and (``float_check``) that lowering's check before its own."""

    op_name: str
    fn: Callable
    types: tuple = (FLOAT,)
    static: tuple[int, ...] | str = ()
    check: Callable | None = None
    gap: bool = False
    float_check: bool = False


class Rows(list):
    """A lowering module's table entries, in the order it declares them."""

    def add(self, op_name: str, fn: Callable, *, types: Iterable[str | None] = (FLOAT,),
            static: tuple[int, ...] | str = (), check: Callable | None = None) -> Callable:
        self.append(Row(op_name, fn, tuple(types), static, check))
        return fn

    def gap(self, op_name: str, fn: Callable, check: Callable | None, types: Iterable[str | None], *,
            float_check: bool = False) -> None:
        self.append(Row(op_name, fn, tuple(types), (), check, gap=True, float_check=float_check))


def on_jnp(fn: Callable, **extra) -> Callable:
    """The lowering of ``fn(xp, call, *inputs)``, an op's arithmetic written once over an array
    namespace (its reference kernel runs it on NumPy), traced over jax.numpy."""
    import jax.numpy as jnp

    def lower(call, *inputs):
        return fn(jnp, call, *inputs, **extra)
    lower.__qualname__ = f"on_jnp({fn.__name__})"
    return lower


def all_of(*checks: Callable | None) -> Callable:
    """One check ``(op, opts) -> reason | None`` running ``checks`` in order (the first reason wins)."""
    def check(op, opts) -> str | None:
        for fn in checks:
            reason = None if fn is None else fn(op, opts)
            if reason is not None:
                return reason
        return None
    return check


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


#: The dtype_policy's compute type (jnp.bfloat16) while nodes trace under it, else None: set by
#: kiln/xla/graph.py's `run_nodes`, so subgraphs a WHILE / IF traces inherit it and the recurrent
#: lowerings, which keep their state in float32, know which type their products take.
FLOAT_POLICY: ContextVar = ContextVar("kiln_xla_float_policy", default=None)


def policy_float(dtype) -> bool:
    """float32, or the dtype_policy's type while tracing under it: what a float lowering takes."""
    policy = FLOAT_POLICY.get()
    return np.dtype(dtype) == np.float32 or (policy is not None and np.dtype(dtype) == np.dtype(policy))


def policy_product(product, a, b):
    """``product(a, b)`` (jnp.matmul, an einsum) of float operands: at full precision (no TF32 on
    GPUs), or under the bfloat16 policy on bfloat16 operands accumulating in float32 (the tensor
    cores' mode; float64 operands keep full precision)."""
    import jax.numpy as jnp
    from jax import lax

    policy = FLOAT_POLICY.get()
    if policy is None or not all(policy_float(np.dtype(v.dtype)) for v in (a, b)):
        return product(a, b, precision=lax.Precision.HIGHEST)
    return product(jnp.asarray(a).astype(policy), jnp.asarray(b).astype(policy), preferred_element_type=jnp.float32)


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


def per_tensor(op, kinds=(DType.INT8,)) -> str | None:
    """None when every quantized tensor of ``op`` has one scale and one of ``kinds`` (a check
    of the lowerings that take one scale per tensor)."""
    for t in (*op.inputs, *op.outputs):
        if t is None or not t.dtype.name.startswith(("INT", "UINT")):
            continue
        q = t.quantization
        if q is None or q.scale.size == 0:
            continue
        if t.dtype not in kinds or q.scale.size != 1:
            return (f"{op.name}: quantized tensor {t.name!r} is {t.dtype.name} with {q.scale.size} scales; "
                    f"lowered: {'/'.join(k.name for k in kinds)} with one scale")
    return None
