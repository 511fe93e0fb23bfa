"""The model's minimum LiteRT runtime version, from the op records' ``runtime_versions``.

Every model kiln writes that carries the ``min_runtime_version`` metadata gets it recomputed
from its operators as they are then (`refresh_min_runtime_version`, called by the writer), so
no path that changes ops or versions — quantization, the inference converter, a user's own
IR edits — can leave the float model's value behind.

Each record lists, per version, the first runtime release that runs it (TensorFlow's
runtime_version.cc); a version the record has no entry for is an error, so a forgotten row
cannot silently lower the minimum. The model's minimum is the largest of its ops' versions,
compared component-wise as integers, written as 16 bytes padded with NULs into the
``min_runtime_version`` metadata.
"""

from __future__ import annotations

from typing import Iterable

from .. import ops
from ..errors import ModelError, OpError
from ..ir import Model


def op_runtime_version(op_type: str, version: int) -> str | None:
    """First runtime release that runs ``version`` of builtin ``op_type``; None where LiteRT's
    table has no row for it (the record says UNLISTED).

    Raises:
      ModelError: kiln has no record of ``op_type``, or the record lacks ``version``.
    """
    record = ops.get(op_type)
    if record is None:
        raise ModelError(f"cannot tell the minimum runtime of {op_type} version {version}: "
                         "kiln has no op record for it")
    try:
        return record.runtime_version(version) or None
    except OpError as exc:
        raise ModelError(str(exc)) from None


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def max_version(versions: Iterable[str]) -> str:
    """The largest version string, comparing components as integers ("" when none)."""
    best = ""
    for v in versions:
        if not best or _key(v) > _key(best):
            best = v
    return best


def model_runtime_version(model: Model) -> str:
    """The model's minimum runtime version: the max over its builtin ops ("" if none listed).

    Raises:
      ModelError: an op's record has no runtime version for the op's version.
    """
    found = []
    for si, oi, op in model.operators():
        if op.op_type == "CUSTOM":
            continue
        try:
            found.append(op_runtime_version(op.op_type, op.version))
        except ModelError as exc:
            raise ModelError(f"subgraph {si}, operator {oi}: {exc}") from None
    return max_version(v for v in found if v)


def min_runtime_version_bytes(version: str) -> bytes:
    """The 16-byte, NUL-padded ``min_runtime_version`` metadata value."""
    raw = version.encode("ascii")
    if len(raw) >= 16:
        return b"\0" * 16
    return raw + b"\0" * (16 - len(raw))


def refresh_min_runtime_version(model: Model) -> str | None:
    """Recompute the model's ``min_runtime_version`` metadata if it carries one; returns the
    new value (None when the model has no such entry)."""
    if "min_runtime_version" not in model.metadata:
        return None
    version = model_runtime_version(model)
    model.metadata["min_runtime_version"] = min_runtime_version_bytes(version)
    return version
