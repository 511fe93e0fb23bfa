"""Resource variables: VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE.

A handle is an int32 scalar naming a slot in the runtime's variable store, keyed by
(container, shared_name) so every subgraph that names the same variable shares it.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpError
from ..schema import DType
from .record import UNLISTED, OpDef, OptionsSpec, input_dtype, on_codes


def _var_handle(call):
    rid = call.runtime.resource_id(call.opts.container or "", call.opts.shared_name or "")
    return np.array(rid, dtype=np.int32)


def _read_variable(call, handle):
    rid = int(np.asarray(handle).reshape(()))
    value = call.runtime.variables.get(rid)
    if value is None:
        raise OpError(f"READ_VARIABLE of resource {rid} before any ASSIGN_VARIABLE initialised it")
    return value


def _assign_variable(call, handle, value):
    rid = int(np.asarray(handle).reshape(()))
    call.runtime.variables[rid] = np.array(value, copy=True)
    return ()


def _assign_version(op) -> int:
    return 2 if input_dtype(op, 1) == DType.INT8 else 1


OPS = (
    OpDef("VAR_HANDLE", _var_handle, OptionsSpec("VarHandleOptions", {"container": "", "shared_name": ""}),
          runtime_versions=("2.6.0",), stateful=True,
          resource=True),
    OpDef("READ_VARIABLE", _read_variable,
          runtime_versions=("2.6.0",), stateful=True, quantized=on_codes(_read_variable),
          resource=True),
    OpDef("ASSIGN_VARIABLE", _assign_variable, version=_assign_version, max_version=2,
          runtime_versions=("2.6.0", UNLISTED), side_effects=True, quantized=on_codes(_assign_variable),
          resource=True),
)
