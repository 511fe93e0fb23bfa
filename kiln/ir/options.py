"""An operator's builtin options: a dict that refuses names the op's record does not declare
and answers a missing name with the schema default.

Validation happens where an option is written (construction, ``op.options[name] = v``), so a
typo such as ``filter_widht`` fails at once, naming the op, instead of running with the default
until the writer rejects the field. Reading ``op.options[name]`` gives the stored value or the
schema default, so no caller restates a default; ``get(name)`` does the same for a name the op
may not declare (generic passes), answering None there. Only stored values are kept in the dict (the
writer emits exactly those, and ``in`` / ``dict(op.options)`` see only them). Ops kiln has no
record of (CUSTOM, unknown builtins read from a file) are not checked.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, Mapping

from ..errors import KilnError


class OptionError(KilnError, KeyError):
    """An option name the operator's record does not declare."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


#: ``op_type -> {declared option: schema default}``, or None for an op whose options are not
#: checked. The op records sit above the IR, so kiln.ops hands its lookup down when it loads.
_lookup: Callable[[str], Mapping[str, Any] | None] | None = None


def use_declared_options(lookup: Callable[[str], Mapping[str, Any] | None]) -> None:
    """Make OpOptions check names against ``lookup`` (kiln.ops passes its records')."""
    global _lookup
    _lookup = lookup


def _declared(op_type: str) -> Mapping[str, Any] | None:
    return None if _lookup is None else _lookup(op_type)


class OpOptions(dict):
    """Builtin options of one ``op_type``, checked against its record's options table."""

    __slots__ = ("op_type",)

    def __init__(self, op_type: str, values: Mapping[str, Any] | Iterable | None = None):
        super().__init__()
        self.op_type = op_type
        if values:
            self.update(values)

    def _check(self, name: str) -> None:
        known = _declared(self.op_type)
        if known is None or name in known:
            return
        declared = sorted(known)
        close = difflib.get_close_matches(str(name), declared, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listed = f"its options are {declared}" if declared else "it takes no options"
        raise OptionError(f"{self.op_type} has no option {name!r} ({listed}){hint}")

    def __missing__(self, name: str) -> Any:
        self._check(name)
        known = _declared(self.op_type)
        if known is None:
            raise OptionError(f"{self.op_type} has no stored option {name!r} and kiln knows no default for it")
        return known[name]

    def get(self, name: str, default: Any = None) -> Any:
        """The stored value, else the schema default if the op declares ``name``, else
        ``default``: for code that reads an option any op type may or may not have."""
        if name in self:
            return dict.__getitem__(self, name)
        known = _declared(self.op_type)
        if known is not None and name in known:
            return known[name]
        return default

    def __setitem__(self, name: str, value: Any) -> None:
        self._check(name)
        super().__setitem__(name, value)

    def update(self, *args, **kwargs) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return dict.__getitem__(self, name)

    def __ior__(self, other):
        self.update(other)
        return self

    def __reduce__(self):
        return (OpOptions, (self.op_type, dict(self)))

    def __repr__(self) -> str:
        return f"OpOptions({self.op_type!r}, {dict.__repr__(self)})"
