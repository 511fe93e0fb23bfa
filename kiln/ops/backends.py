"""One registry shape for every backend: (op name, operand types) -> implementation, one check.

The record (`OpDef`) holds what an op *is*. What a backend runs for it — kiln's reference
kernels, the NumPy delegate's chains, the XLA lowerings — lives in a `BackendTable` owned by
that backend, keyed the way the record dispatches its own kernels: the op's name and the
node's operand types (`kiln.ops.record.operand_types`: `FLOAT` (None) for float nodes,
"int8" / "uint8" / "int16" for integer-quantized ones, "hybrid" for float activations with
quantized weights). An entry holds the backend's own value (a kernel, a chain lowering, a JAX
lowering) and an optional ``check(op) -> reason | None`` for the nodes of its key it still
cannot run. `BackendTable.decide` gives a backend's verdict on one node as a
`kiln.rules.Decision` (stage "backend"), so "why does XLA not run this node" reads like
"why did this fusion not fire".

Registering for a name without a record is refused (a typo, or an op kiln cannot read or
run), and so is a second registration of the same key unless it says ``override=True``.
The support matrix (docs/support_matrix.md, kiln/support_matrix.py) is generated from the
tables, so what the docs say each backend runs is what it registers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Iterator, TypeVar

from ..errors import KilnError
from ..rules import Decision
from .record import operand_types
from .traits import HYBRID, INT8, INT16, UINT8

if TYPE_CHECKING:  # pragma: no cover
    from ..ir import Operator

V = TypeVar("V")

#: The operand-types key of a float node (no quantized operands).
FLOAT = None
#: Every operand-types key, in the order tables and the support matrix list them.
KEYS: tuple[str | None, ...] = (FLOAT, INT8, UINT8, INT16, HYBRID)
#: The stage of a backend's decisions (`kiln.rules.Decision.stage`).
STAGE = "backend"

Check = Callable[["Operator"], "str | None"]


def key_name(types: str | None) -> str:
    """How a key reads in messages and the matrix: "float" for `FLOAT`, else the key."""
    return "float" if types is FLOAT else types


class BackendTableError(KilnError, ValueError):
    """A registration a backend table refuses (unknown op or key, or a second one without override)."""


@dataclass(frozen=True)
class Entry(Generic[V]):
    """What one backend runs for the nodes of one op with one operand-types key."""

    op_name: str
    types: str | None
    value: V
    check: Check | None = None

    def why_not(self, op: "Operator") -> str | None:
        """None if the entry runs node ``op``, else the reason (its check's)."""
        return None if self.check is None else self.check(op)


class BackendTable(Generic[V]):
    """``(op name, operand types) -> Entry`` for one backend; see the module docstring.

    ``fill(table)``, when given, is the one function that puts the backend's own entries in:
    the table calls it on its first use (a lookup, or a registration of one's own)."""

    def __init__(self, backend: str, fill: Callable[["BackendTable[V]"], None] | None = None):
        self.backend = backend
        self._entries: dict[tuple[str, str | None], Entry[V]] = {}
        self._unchecked: list[str] = []
        self._fill = fill

    def _filled(self) -> None:
        fill, self._fill = self._fill, None
        if fill is not None:
            fill(self)

    # -- registering ----------------------------------------------------------------------------
    def register(self, op_name: str, value: V, *, types: Iterable[str | None] = (FLOAT,),
                 check: Check | None = None, override: bool = False) -> V:
        """Add ``value`` for builtin ``op_name``'s nodes with each operand-types key in
        ``types`` (default: float nodes), under ``check``; returns ``value``."""
        self._filled()
        keys = tuple(types)
        for key in keys:
            if key not in KEYS:
                raise BackendTableError(f"{self.backend}: {key!r} is not an operand-types key "
                                        f"(one of {', '.join(key_name(k) for k in KEYS)})")
            if (op_name, key) in self._entries and not override:
                raise BackendTableError(f"{self.backend}: {op_name} with {key_name(key)} operands is registered "
                                        "already (pass override=True to replace it)")
        for key in keys:
            self._entries[op_name, key] = Entry(op_name, key, value, check)
        self._unchecked.append(op_name)
        self._check_names()
        return value

    def unregister(self, op_name: str, types: Iterable[str | None] | None = None) -> None:
        """Drop ``op_name``'s entries for ``types`` (None: every key)."""
        self._filled()
        for key in (KEYS if types is None else tuple(types)):
            self._entries.pop((op_name, key), None)

    def _check_names(self) -> None:
        """Refuse names without a record. A table filled while the records are still loading
        (its module imported by an op family) is checked on its first use instead."""
        records = getattr(sys.modules.get(__package__), "OPS", None)
        if records is None:
            return
        unknown = [name for name in self._unchecked if name not in records]
        for key in [k for k in self._entries if k[0] in unknown]:
            del self._entries[key]
        self._unchecked.clear()
        if unknown:
            raise BackendTableError(f"{self.backend}: {unknown[0]!r} has no op record; add the record to its "
                                    "family module in kiln/ops first")

    @property
    def _checked(self) -> dict[tuple[str, str | None], Entry[V]]:
        self._filled()
        if self._unchecked:
            self._check_names()
        return self._entries

    # -- looking up -----------------------------------------------------------------------------
    def entry(self, op_name: str, types: str | None = FLOAT) -> Entry[V] | None:
        return self._checked.get((op_name, types))

    def get(self, op_name: str, types: str | None = FLOAT, default: V | None = None) -> V | None:
        """The value registered for ``(op_name, types)``, else ``default``."""
        entry = self.entry(op_name, types)
        return default if entry is None else entry.value

    def __getitem__(self, key: tuple[str, str | None]) -> V:
        op_name, types = key
        entry = self.entry(op_name, types)
        if entry is None:
            raise BackendTableError(f"{self.backend}: nothing registered for {op_name} with "
                                    f"{key_name(types)} operands")
        return entry.value

    def __contains__(self, item: object) -> bool:
        """``"ADD" in table``: any key of the op; ``("ADD", "int8") in table``: that key."""
        if isinstance(item, tuple):
            return item in self._checked
        return any(name == item for name, _ in self._checked)

    def ops(self) -> list[str]:
        """The ops with at least one entry, sorted."""
        return sorted({name for name, _ in self._checked})

    def types_of(self, op_name: str) -> frozenset[str | None]:
        """The operand-types keys registered for ``op_name``."""
        return frozenset(key for name, key in self._checked if name == op_name)

    def entries(self) -> Iterator[Entry[V]]:
        return iter(list(self._checked.values()))

    def __len__(self) -> int:
        return len(self._checked)

    def entry_for(self, op: "Operator") -> Entry[V] | None:
        """The entry for node ``op``'s op and operand types (None: none registered)."""
        return self.entry(op.op_type, operand_types(op))

    # -- deciding -------------------------------------------------------------------------------
    def why_not(self, op: "Operator") -> str | None:
        """None if the backend runs node ``op``, else the reason: no entry for its op, none
        for its operand types, or the entry's check."""
        name, key = op.op_type, operand_types(op)
        entry = self.entry(name, key)
        if entry is not None:
            return entry.why_not(op)
        if op.op_type == "CUSTOM":
            return f"{self.backend} runs no custom ops ({op.name})"
        have = self.types_of(name)
        if not have:
            return f"{self.backend} has no {name}"
        kinds = ", ".join(key_name(k) for k in KEYS if k in have)
        return f"{self.backend} runs {name} with {kinds} operands, not {key_name(key)} ones"

    def decide(self, op: "Operator", subject: str | None = None, reason: str | None = None) -> Decision:
        """The backend's verdict on node ``op`` (``subject``: how the node is named, default
        its op name) as a Decision; ``reason`` overrides the table's own (a delegate's checks
        beyond the table: versions, registrations)."""
        if reason is None:
            reason = self.why_not(op)
        return Decision(STAGE, subject or op.name, self.backend, reason is None, "" if reason is None else reason)

    def __repr__(self) -> str:
        return f"<BackendTable {self.backend}: {len(self.ops())} ops, {len(self)} entries>"


def reference_table(records) -> BackendTable:
    """kiln's reference kernels as a backend table: each record's float ``kernel`` under
    `FLOAT` and its ``quantized`` kernels under their keys (no checks: a reference kernel
    refuses what it cannot run by raising when it runs, as LiteRT's Prepare)."""
    table: BackendTable = BackendTable("reference kernels")
    for name, record in records.items():
        if record.kernel is not None:
            table.register(name, record.kernel)
        for key, kernel in record.quantized.items():
            table.register(name, kernel, types=(key,))
    return table


__all__ = ["FLOAT", "KEYS", "STAGE", "BackendTable", "BackendTableError", "Entry", "key_name", "reference_table"]
