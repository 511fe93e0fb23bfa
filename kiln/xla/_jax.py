"""The one place kiln.xla imports JAX: lazily, with a kiln error that says how to get it.

kiln works without JAX; only the XLA backend needs it, so nothing imports jax at module
import time. Every entry point calls `require_jax()` first.
"""

from __future__ import annotations

from ..errors import UnsupportedError


class XlaUnavailableError(UnsupportedError):
    """JAX is not installed (or cannot be imported), so the XLA backend cannot run."""


def require_jax():
    """The jax module, or an `XlaUnavailableError` naming the extra to install."""
    try:
        import jax
        import jax.numpy  # noqa: F401 - fail here, not deep inside a lowering
    except Exception as exc:  # ImportError, or a broken jaxlib raising something else
        raise XlaUnavailableError(
            f"kiln's XLA backend needs JAX, the 'xla' extra, which cannot be imported here ({type(exc).__name__}: "
            f"{exc}): pip install 'kiln[xla]'") from exc
    return jax


def x64():
    """Context in which the backend traces and runs: 64-bit types on, as the reference kernels
    keep int64/float64 tensors (JAX would silently narrow them to 32 bits otherwise)."""
    return require_jax().enable_x64(True)
