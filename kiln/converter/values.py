"""What a TensorFlow tensor becomes during import, besides a plain IR tensor.

Resource handles resolve to the variable they point at (`ResourceRef`); TensorList variants
(what ``tf.TensorArray`` and ``tf.while_loop`` produce) are lowered to a preallocated tensor
of shape ``[num_elements, *element_shape]`` carried in a `TensorListValue`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Tensor
from ..schema import DType


@dataclass(eq=False)
class VarInfo:
    """A captured resource variable.

    ``handle`` is the eager resource tensor the function captured; ``value`` is read on first
    use. ``mutable`` is decided by the mutability analysis before import: read-only
    variables become constants, mutable ones VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE.
    """

    name: str
    handle: Any
    dtype: DType | None = None
    mutable: bool = False
    _value: np.ndarray | None = field(default=None, repr=False)

    def value(self, tf_dtype=None) -> np.ndarray:
        if self._value is None:
            from .tfutil import tf

            t = tf()
            if tf_dtype is None:
                tf_dtype = _handle_dtype(self.handle)
            self._value = np.asarray(t.raw_ops.ReadVariableOp(resource=self.handle, dtype=tf_dtype).numpy())
        return self._value

    @property
    def shared_name(self) -> str:
        return self.name


def _handle_dtype(handle):
    data = getattr(handle, "_handle_data", None)
    if data is not None and data.shape_and_type:
        from .tfutil import tf

        return tf().as_dtype(data.shape_and_type[0].dtype)
    from ..errors import ConversionError

    raise ConversionError(f"cannot tell the type of variable handle {handle!r}")


@dataclass(eq=False)
class ResourceRef:
    """A resource-typed TF tensor that refers to a known variable."""

    var: VarInfo


@dataclass(eq=False)
class TensorListValue:
    """A lowered TensorList: ``tensor`` holds all elements stacked along axis 0.

    ``element_signature`` may have -1 dims; when it does, the list was allocated with size-1
    dims there and is broadcast to the items' shape on the first write.
    """

    tensor: Tensor
    element_dtype: DType
    element_signature: tuple[int, ...]

    @property
    def dynamic_elements(self) -> bool:
        return any(d < 0 for d in self.element_signature)

    @property
    def signature(self) -> tuple[int, ...]:
        """[num_elements, *element_signature]: what the tensor may hold at run time (its
        static shape can be narrower, e.g. a preallocated constant)."""
        return (self.tensor.signature[0], *self.element_signature)
