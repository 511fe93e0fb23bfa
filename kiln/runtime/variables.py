"""The interpreter's resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE).

One store per interpreter, shared by every subgraph: two VAR_HANDLEs with the same
(container, shared_name) name one variable. Reference kernels read and write NumPy arrays
through the mapping. A delegate may `hold` a value in its own memory (a device array): it
stays there between invokes, and is copied to NumPy only when a reader outside the delegate
asks for it (the copy is kept until the next write), so the store is always current for
every reader without a round trip per invoke.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np


class ResourceVariables(MutableMapping):
    """resource id -> current value; ``held(rid)`` gives a delegate the value as stored."""

    def __init__(self):
        self._values: dict[int, object] = {}   # NumPy arrays, or values a delegate holds
        self._host: dict[int, np.ndarray] = {}  # NumPy copies of held values, made on demand
        self._ids: dict[tuple[str, str], int] = {}

    def resource_id(self, container: str, shared_name: str) -> int:
        """The id of variable (container, shared_name), the same for every subgraph."""
        return self._ids.setdefault((container, shared_name), len(self._ids))

    # -- the mapping reference kernels use: NumPy values -------------------------------------
    def __getitem__(self, rid: int) -> np.ndarray:
        value = self._values[rid]
        if type(value) is np.ndarray:
            return value
        host = self._host.get(rid)
        if host is None:
            host = self._host[rid] = np.asarray(value)
        return host

    def __setitem__(self, rid: int, value) -> None:
        self._values[rid] = value
        self._host.pop(rid, None)

    def __delitem__(self, rid: int) -> None:
        del self._values[rid]
        self._host.pop(rid, None)

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    # -- delegates ---------------------------------------------------------------------------
    def held(self, rid: int):
        """The value as stored (a delegate's device array, or NumPy), or None if unset."""
        return self._values.get(rid)

    def hold(self, rid: int, value) -> None:
        """Store ``value`` (any array with shape and dtype) as it is, without copying it to
        NumPy: readers outside the delegate get a NumPy copy when they first ask."""
        self[rid] = value

    # -- dry runs (refresh_shapes) -----------------------------------------------------------
    def snapshot(self) -> dict:
        return dict(self._values)

    def restore(self, snapshot: dict) -> None:
        self._values = dict(snapshot)
        self._host = {}
