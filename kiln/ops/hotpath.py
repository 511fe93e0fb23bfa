"""Small helpers that keep the reference kernels' per-invoke Python overhead low.

Most zoo models run tiny tensors, so a kernel's cost is its Python work, not its arithmetic.
Kernels therefore keep what depends only on their node (checks passed, geometry, weight
layouts) in ``KernelCall.state``, and use these helpers instead of NumPy's Python-level
wrappers (``np.clip``, ``np.errstate``). None of them changes a result.
"""

from __future__ import annotations

import numpy as np

try:
    from numpy._core import umath as _um
except ImportError:  # pragma: no cover - NumPy 1
    from numpy.core import umath as _um

try:  # NumPy 2 keeps the floating-point error state in a context variable
    from numpy._core._ufunc_config import _extobj_contextvar as _EXTOBJ, _make_extobj
except ImportError:  # pragma: no cover - other NumPy layouts: use the public context manager
    _EXTOBJ = None

_clip_ufunc = _um.clip


class _Quiet:
    """``np.errstate(all="ignore")`` for a kernel body, without its Python-level overhead."""

    __slots__ = ("_token",)
    #: (error state, the same state with every error ignored), derived once per outer state
    #: so that bufsize and the error callback are kept; one attribute, so threads never see a
    #: mismatched pair.
    _derived = (None, None)

    def __enter__(self):
        current = _EXTOBJ.get()
        source, ignore = _Quiet._derived
        if current is not source:
            ignore = _make_extobj(all="ignore")
            _Quiet._derived = (current, ignore)
        self._token = _EXTOBJ.set(ignore)

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


def small_key(arr) -> tuple | None:
    """A hashable snapshot of a small operand (a shape, axes, a permutation), None if absent."""
    if arr is None:
        return None
    a = np.asarray(arr)
    return a.dtype.str, a.shape, a.tobytes()


__all__ = ["clip", "quiet", "small_key"]
