"""Open per-op tables: what a backend adds to an op beyond its record.

The record (`OpDef`) is closed: it holds what the op *is* (options, versions, reference
kernel). Interpretations other backends add — compiled-delegate lowerings, later
quantization rules or XLA lowerings — live in an `OpTable` owned by that backend and keyed
by op name, as JAX keeps ``register_lowering`` apart from its primitives. Registering for a
name without a record is refused (a typo, or an op kiln cannot read or run), and so is a
second registration unless it says ``override=True``.
"""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

from ..errors import KilnError

V = TypeVar("V")


class OpTableError(KilnError, ValueError):
    """A registration an op table refuses (unknown op, or a second one without override)."""


class OpTable(Generic[V]):
    """``op name -> V`` for one backend; see the module docstring for the rules."""

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[str, V] = {}

    def register(self, op_name: str, value: V, *, override: bool = False) -> V:
        """Add ``value`` for builtin ``op_name``; returns ``value`` (usable as a decorator body)."""
        from . import OPS  # local: the registry imports the families, which may own tables

        if op_name not in OPS:
            raise OpTableError(f"{self.name}: {op_name!r} has no op record; add the record to its "
                               "family module in kiln/ops first")
        if op_name in self._entries and not override:
            raise OpTableError(f"{self.name}: {op_name} is registered already (pass override=True "
                               "to replace it)")
        self._entries[op_name] = value
        return value

    def unregister(self, op_name: str) -> None:
        self._entries.pop(op_name, None)

    def get(self, op_name: str, default: V | None = None) -> V | None:
        return self._entries.get(op_name, default)

    def __getitem__(self, op_name: str) -> V:
        try:
            return self._entries[op_name]
        except KeyError:
            raise OpTableError(f"{self.name}: nothing registered for {op_name}") from None

    def __contains__(self, op_name: object) -> bool:
        return op_name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self):
        return self._entries.keys()

    def items(self):
        return self._entries.items()

    def __repr__(self) -> str:
        return f"<OpTable {self.name}: {len(self)} ops>"
