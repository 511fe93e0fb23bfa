"""Small helpers that keep the reference kernels' per-invoke Python overhead low.

Most zoo models run tiny tensors, so a kernel's cost is its Python work, not its arithmetic:
re-validating operands, re-deriving weight layouts, NumPy's Python-level wrappers
(``np.clip``, ``np.errstate``). These helpers do that work once per node, in the node's
``KernelCall.state``, or call the underlying ufunc directly. None of them changes a result.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numpy._core import umath as _um

try:  # NumPy 2 keeps the floating-point error state in a context variable
    from numpy._core._ufunc_config import _extobj_contextvar as _EXTOBJ, _make_extobj
except ImportError:  # pragma: no cover - other NumPy layouts: use the public context manager
    _EXTOBJ = None

_clip_ufunc = _um.clip


class _Quiet:
    """``np.errstate(all="ignore")`` for a kernel body, without its Python-level overhead."""

    __slots__ = ("_token",)
    _source = None   # the error state the cached "ignore" state was derived from
    _ignore = None

    def __enter__(self):
        current = _EXTOBJ.get()
        if current is not _Quiet._source:  # derive once per outer state (keeps bufsize, call)
            _Quiet._ignore = _make_extobj(all="ignore")
            _Quiet._source = current
        self._token = _EXTOBJ.set(_Quiet._ignore)

    def __exit__(self, *exc_info):
        _EXTOBJ.reset(self._token)


def quiet():
    """A context manager that ignores floating-point errors, like ``np.errstate(all="ignore")``."""
    return _Quiet() if _EXTOBJ is not None else np.errstate(all="ignore")


def clip(x: np.ndarray, lo, hi, out: np.ndarray | None = None):
    """``np.clip(x, lo, hi, out=out)`` with both bounds given.

    For floats ``np.clip`` ends in the ``clip`` ufunc after a few Python layers; call it
    directly. Integers keep ``np.clip``, which first drops bounds outside the type's range.
    """
    if x.dtype.kind == "f":
        return _clip_ufunc(x, lo, hi, out=out)
    return np.clip(x, lo, hi, out=out)


def from_constant(call, key, arr: np.ndarray, build: Callable[[np.ndarray], object]):
    """``build(arr)``, computed once per node while operand ``arr`` is the same read-only array.

    Weights and other constants reach a kernel as the model's own read-only buffers, the same
    object on every invoke; whatever a kernel derives from them (a transposed or stacked
    layout, a float32 copy) is kept in ``call.state[key]``. A writeable array may change
    between invokes, so it is never cached: the result is then rebuilt every time.
    """
    hit = call.state.get(key)
    if hit is not None and hit[0] is arr:
        return hit[1]
    value = build(arr)
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        call.state[key] = (arr, value)
    return value


def small_key(arr) -> tuple | None:
    """A hashable snapshot of a small operand (a shape, axes, a permutation), None if absent."""
    if arr is None:
        return None
    a = np.asarray(arr)
    return a.dtype.str, a.shape, a.tobytes()


__all__ = ["clip", "from_constant", "quiet", "small_key"]
