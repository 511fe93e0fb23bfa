"""Resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE) and CALL_ONCE as state
carried through a traced function, for `to_jax` (kiln/ops/variables.py and control_flow.py
keep them in the interpreter's store).

While `to_jax`'s function traces, a `VariableStore` holds each variable's current value by
name: VAR_HANDLE gives the variable's index in it (known while tracing, so READ and ASSIGN
resolve statically), READ_VARIABLE returns the value and ASSIGN_VARIABLE replaces it — in
program order, as the reference kernels do. CALL_ONCE runs its init subgraph the first time
the store meets it; `initial_state()` of a stateful function runs them all, so the state a
user carries between calls already holds every variable and later CALL_ONCEs do nothing.

XlaDelegate's partitions trace the same lowerings with a store backed by the interpreter's
variables instead (kiln/xla/partition_vars.py).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import numpy as np

from ..errors import OpError
from .graph import is_resource_op
from .lower_control import _subgraph, _subgraph_problem, _traced
from .lowering import CODES, Rows

__all__ = ["VariableStore", "is_resource_op", "using", "variable_name"]

_STORE: contextvars.ContextVar = contextvars.ContextVar("kiln_xla_variable_store", default=None)

#: This module's entries of the XLA table (kiln/xla/table.py's `fill` registers them).
ROWS = Rows()


def variable_name(container: str, shared_name: str) -> str:
    return f"{container}/{shared_name}" if container else shared_name


class VariableStore:
    """Variable values by name while a function traces, and the CALL_ONCE inits already run.

    The lowerings below ask the store in use for everything (``handle``, ``read``,
    ``assign``, ``call_once``), so XlaDelegate's partitions trace with a store of their own
    (kiln/xla/partition_vars.py) backed by the interpreter's variables.
    """

    def __init__(self, values: dict | None = None, inits_done: set | None = None):
        self.names: list[str] = []
        self.values: dict = dict(values or {})
        self.inits_done: set = set(inits_done or ())

    def _index(self, name: str) -> int:
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def _name_of(self, call, handle) -> str:
        if not isinstance(handle, np.ndarray) or handle.size != 1:
            raise OpError(f"{call.op.name}: the variable handle must come from a VAR_HANDLE of this subgraph")
        index = int(handle.reshape(()))
        if not 0 <= index < len(self.names):
            raise OpError(f"{call.op.name}: unknown resource handle {index}")
        return self.names[index]

    def handle(self, call) -> np.ndarray:
        return np.array(self._index(variable_name(call.opts.container or "", call.opts.shared_name or "")),
                        np.int32)

    def read(self, call, handle):
        name = self._name_of(call, handle)
        if name not in self.values:
            raise OpError(f"READ_VARIABLE of {name!r} before any ASSIGN_VARIABLE set it (start from the "
                          "function's initial_state())")
        import jax.numpy as jnp

        return jnp.asarray(self.values[name])  # a run-time value, never folded as a constant

    def assign(self, call, handle, value) -> None:
        import jax.numpy as jnp

        self.values[self._name_of(call, handle)] = jnp.asarray(value)

    def call_once(self, call) -> None:
        index = int(call.opts.init_subgraph_index)
        if index not in self.inits_done:
            self.inits_done.add(index)
            _traced(call.op, index, call.label)([])


@contextmanager
def using(store):
    token = _STORE.set(store)
    try:
        yield store
    finally:
        _STORE.reset(token)


def _store(call):
    store = _STORE.get()
    if store is None:
        raise OpError(f"{call.op.name}: resource variables are only lowered inside to_jax's function "
                      "or an XlaDelegate partition")
    return store


def _var_handle(call):
    return _store(call).handle(call)


def _read_variable(call, handle):
    return _store(call).read(call, handle)


def _assign_variable(call, handle, value):
    _store(call).assign(call, handle, value)
    return ()


def _call_once(call):
    _store(call).call_once(call)
    return ()


def _init_check(op, opts):
    try:
        sg = _subgraph(op, int(opts.init_subgraph_index))
    except OpError as exc:
        return str(exc)
    problem = _subgraph_problem(sg, set(), variables=True)
    return None if problem is None else f"CALL_ONCE runs {problem}"


ROWS.add("VAR_HANDLE", _var_handle)
ROWS.add("READ_VARIABLE", _read_variable)
ROWS.add("ASSIGN_VARIABLE", _assign_variable)
# The value moves as stored: quantized codes too (the reference kernels' on_codes).
ROWS.add("READ_VARIABLE", _read_variable, types=CODES)
ROWS.add("ASSIGN_VARIABLE", _assign_variable, types=CODES)
ROWS.add("CALL_ONCE", _call_once, check=_init_check)
