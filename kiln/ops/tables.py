"""Open per-op tables: what a backend adds to an op beyond its record.

The record (`OpDef`) is closed: it holds what the op *is* (options, versions, reference
kernel). Interpretations other backends add — compiled-delegate lowerings, later
quantization rules or XLA lowerings — live in an `OpTable` owned by that backend and keyed
by op name, as JAX keeps ``register_lowering`` apart from its primitives. Registering for a
name without a record is refused (a typo, or an op kiln cannot read or run), and so is a
second registration unless it says ``override=True``.
"""

from __future__ import annotations

import sys
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
        self._unchecked: list[str] = []

    def register(self, op_name: str, value: V, *, override: bool = False) -> V:
        """Add ``value`` for builtin ``op_name``; returns ``value``."""
        if op_name in self._entries and not override:
            raise OpTableError(f"{self.name}: {op_name} is registered already (pass override=True "
                               "to replace it)")
        self._entries[op_name] = value
        self._unchecked.append(op_name)
        self._check()
        return value

    def _check(self) -> None:
        """Refuse names without a record. A table filled while the records are still loading
        (its module imported by an op family) is checked on its first use instead."""
        records = getattr(sys.modules.get(__package__), "OPS", None)
        if records is None:
            return
        unknown = [name for name in self._unchecked if name not in records]
        for name in unknown:
            self._entries.pop(name, None)
        self._unchecked.clear()
        if unknown:
            raise OpTableError(f"{self.name}: {unknown[0]!r} has no op record; add the record to its "
                               "family module in kiln/ops first")

    @property
    def _checked(self) -> dict[str, V]:
        if self._unchecked:
            self._check()
        return self._entries

    def unregister(self, op_name: str) -> None:
        self._entries.pop(op_name, None)

    def get(self, op_name: str, default: V | None = None) -> V | None:
        return self._checked.get(op_name, default)

    def __getitem__(self, op_name: str) -> V:
        try:
            return self._checked[op_name]
        except KeyError:
            raise OpTableError(f"{self.name}: nothing registered for {op_name}") from None

    def __contains__(self, op_name: object) -> bool:
        return op_name in self._checked

    def __iter__(self) -> Iterator[str]:
        return iter(self._checked)

    def __len__(self) -> int:
        return len(self._checked)

    def keys(self):
        return self._checked.keys()

    def items(self):
        return self._checked.items()

    def __repr__(self) -> str:
        return f"<OpTable {self.name}: {len(self)} ops>"
