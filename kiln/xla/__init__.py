"""kiln's XLA backend: lowerings of kiln's ops to JAX, `XlaDelegate` and `to_jax`.

JAX is an optional extra (``pip install kiln[xla]``). Nothing here imports it at import
time: ``import kiln.xla`` works without it, and making an `XlaDelegate` or calling `to_jax`
raises `XlaUnavailableError` (a KilnError) saying what to install. `export_model` saves a
model's compiled partitions next to it (kiln/xla/exported.py) for `XlaDelegate(export=...)`.
"""

from __future__ import annotations

from ._jax import XlaUnavailableError, require_jax
from .delegate import XlaDelegate, XlaPartitionKernel
from .export import to_jax
from .exported import export_model
from .table import Lowering, LoweringCall, LoweringError, get_lowering, lowered_ops, register_lowering

__all__ = [
    "Lowering", "LoweringCall", "LoweringError", "XlaDelegate", "XlaPartitionKernel", "XlaUnavailableError",
    "export_model", "get_lowering", "lowered_ops", "register_lowering", "require_jax", "to_jax",
]
