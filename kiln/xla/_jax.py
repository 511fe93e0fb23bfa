"""The one place kiln.xla imports JAX: lazily, with a kiln error that says how to get it.

kiln works without JAX; only the XLA backend needs it, so nothing imports jax at module
import time. Every entry point calls `require_jax()` first.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

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


#: The folder of JAX's persistent compilation cache that kiln turns on ($KILN_XLA_CACHE; empty: off).
CACHE_ENV = "KILN_XLA_CACHE"
#: The most the cache folder kiln sets up holds.
CACHE_BYTES = 2 << 30
_cache_dir: list = []  # [the folder kiln set, or None], once decided


def cache_dir() -> str | None:
    """Where compiled XLA executables persist between processes: $KILN_XLA_CACHE, else
    ``$XDG_CACHE_HOME/kiln/xla`` (``~/.cache/kiln/xla``); None when $KILN_XLA_CACHE is empty."""
    path = os.environ.get(CACHE_ENV)
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "kiln", "xla")
    return path or None


def enable_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache in `cache_dir` (once per process, before the
    backend's first compile), so a second process loading a model compiles nothing. A cache
    folder the user gave JAX (jax_compilation_cache_dir, $JAX_COMPILATION_CACHE_DIR) is left as
    it is, and so is a cache the user turned off (jax_enable_compilation_cache). Every compile
    is kept (JAX keeps only those over 1 s by default: a model's small partitions add up) and the
    folder is bounded to `CACHE_BYTES` (least recently used entries go; JAX needs the ``filelock``
    package for that, else the folder grows until cleared), unless the user set
    $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS / $JAX_COMPILATION_CACHE_MAX_SIZE. Returns the
    folder in use, or None."""
    jax = require_jax()
    if _cache_dir:
        return jax.config.jax_compilation_cache_dir or None
    _cache_dir.append(None)
    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return jax.config.jax_compilation_cache_dir or None
    path = cache_dir()
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        warnings.warn(f"kiln: XLA compiles are not cached: cannot create {path} ({exc}); set "
                      f"{CACHE_ENV} to a writable folder, or to an empty value to silence this", stacklevel=2)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    settings = [("jax_persistent_cache_min_compile_time_secs", 0.0)]
    if importlib.util.find_spec("filelock") is not None:  # JAX bounds the folder only with it
        settings.append(("jax_compilation_cache_max_size", CACHE_BYTES))
    for name, value in settings:
        if name.upper() not in os.environ:
            jax.config.update(name, value)
    _cache_dir[0] = path
    return path
