"""Op resolvers: map (op, version) to a kernel registration.

A `Registration` is either a builtin reference kernel (the functional form of an op record)
or a Python custom op following the LiteRT custom-operator contract — init / free /
prepare / invoke — with Python callables instead of C function pointers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import ops
from ..errors import RegistrationError
from ..schema import BUILTIN_CODES, BUILTIN_NAMES


class OpResolverType(enum.Enum):
    """Which kernels an Interpreter runs (ai_edge_litert's ``OpResolverType``).

    kiln has one builtin kernel per op, the NumPy reference kernel; its speed comes from the
    default delegates (LiteRT's kernels with ai-edge-litert installed, then kiln's compiled
    and quantized delegates), as LiteRT's comes from XNNPACK. So AUTO and BUILTIN run the
    reference kernels under the default delegates, and BUILTIN_REF and
    BUILTIN_WITHOUT_DEFAULT_DELEGATES run the reference kernels alone. Delegates passed in
    ``experimental_delegates`` apply under every type.
    """

    AUTO = 0
    BUILTIN = 1
    BUILTIN_REF = 2
    BUILTIN_WITHOUT_DEFAULT_DELEGATES = 3

    @property
    def applies_default_delegates(self) -> bool:
        return self in (OpResolverType.AUTO, OpResolverType.BUILTIN)

    @classmethod
    def of(cls, value) -> "OpResolverType":
        """kiln's member for ``value``: None (AUTO), a member, or ai_edge_litert's member of that name."""
        if value is None:
            return cls.AUTO
        if isinstance(value, cls):
            return value
        name = getattr(value, "name", None)
        if isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise TypeError(f"experimental_op_resolver_type must be an OpResolverType "
                        f"({', '.join(cls.__members__)}), got {value!r}")


@dataclass
class Registration:
    """How to run one op.

    Custom-op contract (all optional):
      init(context, buffer) -> user_data   buffer: the op's custom options bytes
      free(context, user_data)
      prepare(context, node)               check inputs, context.resize_tensor(out, shape)
      invoke(context, node)                write node.outputs[i].data
    ``kernel`` is the functional form used by builtin reference kernels (see kiln.ops.record).
    """

    init: Callable | None = None
    free: Callable | None = None
    prepare: Callable | None = None
    invoke: Callable | None = None
    kernel: Callable | None = field(default=None, repr=False)
    name: str = ""
    version_range: tuple[int, int] = (1, 1)
    #: The op record behind a builtin kernel (None for Python custom ops).
    record: Any = field(default=None, repr=False)


def _op_name(op) -> str:
    if isinstance(op, int):
        try:
            return BUILTIN_NAMES[op]
        except KeyError:
            raise RegistrationError(f"unknown builtin operator code {op}") from None
    name = str(getattr(op, "name", op))
    return name


class MutableOpResolver:
    """An op resolver you fill yourself: builtins and custom ops, each for a version range.

    Builtins and custom ops live in separate tables, as in LiteRT: a model's operator code
    says which table to look in, so a custom op may share a builtin's name ("ADD") without
    hiding the builtin.
    """

    def __init__(self):
        self._builtins: dict[str, list[Registration]] = {}
        self._customs: dict[str, list[Registration]] = {}

    def add_builtin(self, op, registration: Registration, min_version: int = 1, max_version: int = 1) -> None:
        """Register ``registration`` for builtin ``op`` (name, code) at versions min..max.

        A later registration overrides earlier ones for the versions it covers.
        """
        name = _op_name(op)
        if name not in BUILTIN_CODES:
            raise RegistrationError(f"{name!r} is not a builtin operator")
        self._add(self._builtins, name, registration, min_version, max_version)

    def add_custom(self, name: str, registration: Registration, min_version: int = 1, max_version: int = 1) -> None:
        """Register a custom op by the name the model uses (its custom_code)."""
        self._add(self._customs, str(name), registration, min_version, max_version)

    @staticmethod
    def _add(table, name, registration, lo, hi):
        if lo > hi or lo < 1:
            raise RegistrationError(f"bad version range {lo}..{hi} for {name}")
        reg = Registration(**{**registration.__dict__, "name": name, "version_range": (lo, hi)})
        table.setdefault(name, []).insert(0, reg)

    def find_op(self, op, version: int = 1) -> Registration | None:
        """The registration for ``op`` at ``version``: a builtin when ``op`` is a builtin code
        or name, else the custom op of that name (use `find_custom` for a custom op whose
        name is also a builtin's)."""
        return self._find(*self._table_for(op), version)

    def find_custom(self, name: str, version: int = 1) -> Registration | None:
        """The custom op registered as ``name`` (a model's custom_code) at ``version``."""
        return self._find(self._customs, str(name), version)

    def registered_versions(self, op) -> list[tuple[int, int]]:
        """Version ranges registered for ``op``, looked up as `find_op` does."""
        table, name = self._table_for(op)
        return [reg.version_range for reg in table.get(name, ())]

    def registered_custom_versions(self, name: str) -> list[tuple[int, int]]:
        """Version ranges registered for custom op ``name``."""
        return [reg.version_range for reg in self._customs.get(str(name), ())]

    def _table_for(self, op) -> tuple[dict, str]:
        name = _op_name(op)
        return (self._builtins if name in BUILTIN_CODES else self._customs), name

    @staticmethod
    def _find(table, name: str, version: int) -> Registration | None:
        for reg in table.get(name, ()):
            lo, hi = reg.version_range
            if lo <= version <= hi:
                return reg
        return None


class BuiltinOpResolver(MutableOpResolver):
    """All of kiln's builtin reference kernels, each for versions 1..its record's max_version."""

    def __init__(self):
        super().__init__()
        for name, record in ops.OPS.items():
            if record.kernel is None:
                continue
            reg = Registration(kernel=record.kernel, record=record)
            self.add_builtin(name, reg, 1, record.max_version)
