"""How a failure inside a node reaches the user: as its own exception, naming the node.

Errors kiln raises on purpose (`KilnError`) and exceptions of a custom op's own types are
re-raised as the same object with the node prefixed to the message, so ``except MyError``
and the object's own attributes keep working (re-creating it as ``type(exc)(message)``
breaks every class with its own ``__init__``). Built-in Python exceptions from a kernel or
a custom op (a bug, a NumPy complaint) become an `OpError` — the RuntimeError LiteRT raises
— chained to the original.
"""

from __future__ import annotations

from ..errors import KilnError, OpError

#: Attribute set on an exception once the interpreter has named its node: an enclosing node
#: (the WHILE running the failing body) then adds itself instead of wrapping it again.
_NAMED = "_kiln_node_named"


def in_node(exc: Exception, where: str, *, user_code: bool = False) -> Exception:
    """The exception to raise for ``exc`` escaping the node ``where`` describes.

    ``user_code``: ``exc`` came from a Python custom op (its own exception types are kept).
    """
    own_type = user_code and type(exc).__module__ != "builtins"
    if isinstance(exc, KilnError) or own_type or getattr(exc, _NAMED, False):
        _prefix(exc, where)
        return exc
    err = OpError(f"{where}: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    err.__suppress_context__ = True
    setattr(err, _NAMED, True)
    return err


def _prefix(exc: Exception, where: str) -> None:
    """Put ``where`` in front of ``exc``'s message, in place."""
    try:
        setattr(exc, _NAMED, True)
    except AttributeError:  # a class with __slots__ and no __dict__: still prefixed below
        pass
    old = exc.args
    if old and isinstance(old[0], str):
        exc.args = (f"{where}: {old[0]}", *old[1:])
        if where in str(exc):
            return
        exc.args = old  # a __str__ that ignores args: leave them, add a note instead
    elif not old:
        exc.args = (f"{where}: {type(exc).__name__}",)
        if where in str(exc):
            return
        exc.args = old
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(where)
