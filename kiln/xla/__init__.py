"""kiln's XLA backend: lowerings of kiln's ops to JAX, `XlaDelegate` and `to_jax`.

JAX is an optional extra (``pip install kiln[xla]``); this package imports it only when a
delegate or a JAX function is made, so ``import kiln`` works without it.
"""

from __future__ import annotations

from ._jax import XlaUnavailableError, require_jax
from .table import Lowering, LoweringCall, LoweringError, get_lowering, lowered_ops, register_lowering


def XlaDelegate(device=None, dtype_policy=None, cache_size: int = 8, ops=None):  # noqa: N802 - a class to users
    """`kiln.xla.delegate.XlaDelegate` (see there); raises XlaUnavailableError without JAX."""
    require_jax()
    from .delegate import XlaDelegate as _XlaDelegate

    return _XlaDelegate(device=device, dtype_policy=dtype_policy, cache_size=cache_size, ops=ops)


def to_jax(model, signature_key=None):
    """`kiln.xla.export.to_jax` (see there); raises XlaUnavailableError without JAX."""
    require_jax()
    from .export import to_jax as _to_jax

    return _to_jax(model, signature_key)


__all__ = [
    "Lowering", "LoweringCall", "LoweringError", "XlaDelegate", "XlaUnavailableError", "get_lowering",
    "lowered_ops", "register_lowering", "to_jax",
]
