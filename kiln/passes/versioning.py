"""Versioning: every operator gets the lowest version its options and types need.

The rule is the op record's own (``kiln.ops.get(op.op_type).version``), which follows
TensorFlow's op_version.cc; custom ops stay at version 1.
"""

from __future__ import annotations

from .. import ops
from ..errors import ConversionError
from ..ir import Model
from .manager import Pass


class AssignVersions(Pass):
    """Set ``op.version`` from the op records; ops without a record are listed in ``missing``."""

    name = "assign-versions"

    def __init__(self):
        self.missing: set[str] = set()

    def run(self, model: Model) -> bool:
        changed = False
        for _, _, op in model.operators():
            if op.op_type == "CUSTOM":
                version = 1
            else:
                record = ops.get(op.op_type)
                if record is None:
                    self.missing.add(op.op_type)
                    continue
                try:
                    version = int(record.version(op))
                except Exception as exc:  # noqa: BLE001 - name the op whose rule failed
                    raise ConversionError(f"cannot decide the version of {op.name}: {exc}") from exc
            if version != op.version:
                op.version = version
                changed = True
        return changed
