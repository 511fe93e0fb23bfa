"""Which builtins each TF op's legalisation may write, read from the emitters themselves.

An emitter names the builtins it writes: as string constants (``ctx.emit1("GATHER", ...)``),
through a table keyed by the TF op type (``_BINARY[ctx.type]``) or through the helpers it calls
(`common.reshape` writes RESHAPE). Reading that from the code — not keeping a list beside it —
leaves nothing to drift: the support matrix (docs/support_matrix.md) shows the result, and the
op sweep (tests/converter/test_op_sweep.py) checks every builtin a conversion's report says an
op lowered to (`ConversionReport.lowered`) is one this finds.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Callable, Mapping

from ...ops import OPS


@functools.lru_cache(maxsize=None)
def _tree(fn: Callable) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source (a builtin, a C function)
        return None


def _table_entry(value, key: str | None) -> set[str]:
    """The builtins a module-level table maps ``key`` to (tables keyed by TF op type; a tuple
    entry names them among its items)."""
    entry = value.get(key) if isinstance(value, Mapping) else None
    return {v for v in (entry if isinstance(entry, tuple) else (entry,)) if isinstance(v, str) and v in OPS}


def _type_test(test: ast.AST, key: str | None) -> bool | None:
    """The value of ``ctx.type == "X"`` (``!=``, ``in ("X", "Y")``, ``not in``) for TF op type
    ``key``; None: not such a test."""
    if key is None or not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    left, (right,), op = test.left, test.comparators, test.ops[0]
    if not (isinstance(left, ast.Attribute) and left.attr == "type"):
        return None
    if isinstance(right, ast.Constant) and isinstance(op, (ast.Eq, ast.NotEq)):
        return (key == right.value) == isinstance(op, ast.Eq)
    if isinstance(right, (ast.Tuple, ast.Set)) and all(isinstance(e, ast.Constant) for e in right.elts) \
            and isinstance(op, (ast.In, ast.NotIn)):
        return (key in {e.value for e in right.elts}) == isinstance(op, ast.In)
    return None


def _nodes(node: ast.AST, key: str | None):
    """``node`` and its descendants, but only the branch a test of the op type takes for ``key``."""
    yield node
    if isinstance(node, (ast.If, ast.IfExp)) and (taken := _type_test(node.test, key)) is not None:
        branch = node.body if taken else node.orelse
        children = branch if isinstance(branch, list) else [branch]
    else:
        children = ast.iter_child_nodes(node)
    for child in children:
        yield from _nodes(child, key)


def writes(fn: Callable, key: str | None = None, _seen: frozenset = frozenset()) -> frozenset[str]:
    """The builtins ``fn`` may write for TF op type ``key``: the op names among its string
    constants (not those it compares with, nor those of a branch ``key`` does not take), ``key``'s
    entry of the tables it subscripts, and what the kiln.converter functions it calls write."""
    tree = _tree(fn)
    if tree is None or fn in _seen:
        return frozenset()
    seen = _seen | {fn}
    names = dict(getattr(fn, "__globals__", {}))
    names.update(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    found: set[str] = set()
    nodes = list(_nodes(tree, key))
    tested = {id(e) for node in nodes if isinstance(node, ast.Compare) for c in (node.left, *node.comparators)
              for e in (c, *getattr(c, "elts", ()))}
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OPS:
            if id(node) not in tested:
                found.add(node.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            found |= _table_entry(names.get(node.value.id), key)
        elif isinstance(node, ast.Name) and node.id in names:
            value = names[node.id]
            if inspect.isfunction(value) and value.__module__.startswith("kiln.converter"):
                found |= writes(value, key, seen)
    return frozenset(found)


def coverage(emitters: Mapping[str, Callable], patterns=()) -> dict[str, frozenset[str]]:
    """TF op type -> the builtins its emitter may write; and pattern name -> those its
    rewrite writes (``patterns``: objects with ``name`` and ``emit``)."""
    table = {tf_type: writes(fn, tf_type) for tf_type, fn in emitters.items()}
    for pattern in patterns:
        table[pattern.name] = table.get(pattern.name, frozenset()) | writes(pattern.emit)
    return table
