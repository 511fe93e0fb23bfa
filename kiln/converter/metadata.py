"""Model metadata TF's converter writes: ``min_runtime_version`` and ``CONVERSION_METADATA``."""

from __future__ import annotations

import enum

import flatbuffers

from ..errors import ConversionError, ModelError
from ..format.runtime_version import min_runtime_version_bytes, model_runtime_version
from ..ir import Model


class ModelType(enum.IntEnum):
    """Where the converted model came from (conversion_metadata.fbs)."""

    NONE = 0
    TF_SAVED_MODEL = 1
    KERAS_MODEL = 2
    TF_CONCRETE_FUNCTIONS = 3


def conversion_metadata(*, tf_version: str, model_type: ModelType, model_hash: int, allow_custom_ops: bool,
                        optimization_modes: tuple[int, ...] = ()) -> bytes:
    """The ConversionMetadata flatbuffer (environment + options tables)."""
    b = flatbuffers.Builder(128)
    version = b.CreateString(tf_version)
    b.StartObject(4)  # Environment
    b.PrependUOffsetTRelativeSlot(0, version, 0)
    b.PrependUint32Slot(1, 2, 0)  # api_version: TF2
    b.PrependInt32Slot(2, int(model_type), 0)
    b.PrependUint64Slot(3, model_hash & (2**64 - 1), 0)
    env = b.EndObject()
    modes = 0
    if optimization_modes:
        b.StartVector(4, len(optimization_modes), 4)
        for m in reversed(optimization_modes):
            b.PrependInt32(int(m))
        modes = b.EndVector()
    b.StartObject(5)  # ConversionOptions
    if modes:
        b.PrependUOffsetTRelativeSlot(0, modes, 0)
    b.PrependBoolSlot(1, allow_custom_ops, False)
    b.PrependBoolSlot(2, False, False)
    b.PrependBoolSlot(3, False, False)
    opts = b.EndObject()
    b.StartObject(2)  # ConversionMetadata
    b.PrependUOffsetTRelativeSlot(0, env, 0)
    b.PrependUOffsetTRelativeSlot(1, opts, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def write_metadata(model: Model, *, tf_version: str, model_type: ModelType, model_hash: int,
                   allow_custom_ops: bool, with_conversion_metadata: bool = True) -> str:
    """Store both metadata entries on ``model`` (CONVERSION_METADATA only if
    ``with_conversion_metadata``); returns the min runtime version."""
    try:
        version = model_runtime_version(model)
    except ModelError as exc:
        raise ConversionError(str(exc)) from None
    model.metadata["min_runtime_version"] = min_runtime_version_bytes(version)
    if with_conversion_metadata:
        model.metadata["CONVERSION_METADATA"] = conversion_metadata(
            tf_version=tf_version, model_type=model_type, model_hash=model_hash, allow_custom_ops=allow_custom_ops)
    else:
        model.metadata.pop("CONVERSION_METADATA", None)
    return version
