"""`EmitContext`: what a legalisation emitter sees of the TensorFlow op it rewrites.

An emitter is a small function ``emit(ctx) -> value | list of values`` that turns one TF
operation into TFLite builtin operators in the IR. The context hands it the op's inputs as
IR tensors (constants included), creates output tensors with TensorFlow's static shapes, and
adds operators — folding them at once when all their inputs are constant, with the same
kernels the constant-folding pass uses, so emitters can rely on constants being constants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import ConversionError
from ..ir import Operator, Subgraph, Tensor
from ..ops import type_refusal, unquantized_codes
from ..passes.fold import evaluate
from ..schema import DType
from .tfutil import shape_signature, static_shape, to_dtype
from .values import ResourceRef, TensorListValue

if TYPE_CHECKING:  # pragma: no cover
    from .scope import Scope

_MISSING = object()

#: The builtins LiteRT runs on complex64 tensors, as TF's converter legalises complex values
#: (RFFT2D's spectrum, ``tf.cast`` to complex64): an Add, a slice or a transpose of complex64
#: stays a TF op, and no builtin takes complex128.
COMPLEX_BUILTINS = frozenset({"RFFT2D", "COMPLEX_ABS", "REAL", "IMAG", "MUL", "CAST", "RESHAPE", "SQUEEZE",
                              "EXPAND_DIMS", "IF", "WHILE", "CUSTOM"})
_COMPLEX = (DType.COMPLEX64, DType.COMPLEX128)


def _complex_refusal(op_type: str, tensors) -> str | None:
    """Why LiteRT cannot run ``op_type`` on these tensors' complex types (None: it can)."""
    types = {t.dtype for t in tensors if t is not None and t.dtype in _COMPLEX}
    if DType.COMPLEX128 in types:
        return f"{op_type} on complex128: LiteRT's builtins take complex64 only"
    if types and op_type not in COMPLEX_BUILTINS:
        return f"LiteRT's {op_type} takes no complex64 tensors"
    return None


class Unsupported(ConversionError):
    """Raised by an emitter for a variant of its op it cannot express with builtins; the
    op then becomes a custom op (allow_custom_ops) or is listed as unsupported."""


class EmitContext:
    """One TF operation being legalised into ``scope``'s subgraph."""

    def __init__(self, scope: "Scope", op, source: str | None = None):
        self.scope = scope
        self.op = op
        #: What the report files the ops emitted here under: the TF op type, or the pattern's name.
        self.source = source or op.type

    # -- the TF op ----------------------------------------------------------------------------
    @property
    def sg(self) -> Subgraph:
        return self.scope.sg

    @property
    def name(self) -> str:
        return self.scope.prefix + self.op.name

    @property
    def type(self) -> str:
        return self.op.type

    @property
    def num_inputs(self) -> int:
        return len(self.op.inputs)

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        try:
            value = self.op.get_attr(name)
        except ValueError:  # TF's op.get_attr: the op has no such attribute
            if default is _MISSING:
                raise ConversionError(f"{self.type} {self.op.name!r} has no attribute {name!r}") from None
            return default
        if isinstance(value, bytes):
            return value.decode("utf-8")
        return value

    def fail(self, why: str) -> Unsupported:
        """An `Unsupported` error naming the op (raise it)."""
        return Unsupported(f"{self.type} {self.op.name!r}: {why}")

    # -- inputs -------------------------------------------------------------------------------
    def value(self, i: int):
        return self.scope.lookup(self.op.inputs[i])

    def input(self, i: int) -> Tensor:
        """Input ``i`` as an IR tensor (TensorLists give their stacked tensor)."""
        v = self.value(i)
        if isinstance(v, TensorListValue):
            return v.tensor
        if isinstance(v, ResourceRef):
            raise self.fail(f"input {i} is a resource handle where a value is needed")
        return v

    def inputs(self) -> list[Tensor]:
        return [self.input(i) for i in range(self.num_inputs)]

    def const(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when it is constant at conversion time, else None."""
        v = self.value(i)
        if isinstance(v, Tensor) and v.is_constant:
            return v.data
        return None

    def require_const(self, i: int, what: str) -> np.ndarray:
        value = self.const(i)
        if value is None:
            raise self.fail(f"{what} must be a constant")
        return value

    def in_signature(self, i: int) -> tuple[int, ...]:
        """Static shape of input ``i`` with -1 for unknown dims (from the TF graph)."""
        sig = shape_signature(self.op.inputs[i].shape)
        if sig is None:
            t = self.input(i)
            return tuple(t.signature)
        return sig

    def in_rank(self, i: int) -> int:
        return len(self.in_signature(i))

    # -- outputs ------------------------------------------------------------------------------
    def out_signature(self, i: int = 0) -> tuple[int, ...] | None:
        return shape_signature(self.op.outputs[i].shape)

    def out_dtype(self, i: int = 0) -> DType:
        return to_dtype(self.op.outputs[i].dtype)

    def out(self, i: int = 0, *, dtype: DType | None = None, signature: Sequence[int] | None = None,
            name: str | None = None) -> Tensor:
        """A new tensor for TF output ``i`` (its type and static shape unless given)."""
        if signature is None:
            signature = self.out_signature(i)
        if dtype is None:
            dtype = self.out_dtype(i)
        if name is None:
            name = self.name if i == 0 else f"{self.name}:{i}"
        return self.tensor(name, dtype, signature)

    def tensor(self, name: str, dtype: DType, signature: Sequence[int] | None) -> Tensor:
        """A new intermediate tensor (``signature`` None = unknown rank)."""
        if signature is None:
            return self.sg.add_tensor(self.sg.unique_name(name), dtype, ())
        sig = tuple(int(d) for d in signature)
        return self.sg.add_tensor(self.sg.unique_name(name), dtype, static_shape(sig),
                                  shape_signature=sig, has_rank=True)

    def temp(self, suffix: str, dtype: DType, signature: Sequence[int] | None) -> Tensor:
        return self.tensor(f"{self.name}/{suffix}", dtype, signature)

    def constant(self, value, dtype: DType | None = None, name: str | None = None) -> Tensor:
        arr = np.asarray(value)
        if dtype is None and arr.dtype == np.float64:
            dtype = DType.FLOAT32
        if dtype is not None and dtype != DType.STRING:
            arr = arr.astype(dtype.numpy, copy=False)
        return self.sg.add_constant(self.sg.unique_name(name or f"{self.name}/const"), arr, dtype)

    # -- emitting -----------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor] | None = None,
             *, fold: bool = True, custom_code: str | None = None, custom_options: bytes | None = None,
             **options) -> list[Tensor]:
        """Add a TFLite operator; returns its outputs (constants when it folded at once)."""
        if outputs is None:
            outputs = [self.out(0)]
        op = Operator(op_type, options=options, custom_code=custom_code, custom_options=custom_options)
        self.sg.add_operator(op, list(inputs), list(outputs))
        values = evaluate(op) if fold and self.scope.importer.fold_at_import else None
        if values is not None:
            self.sg.remove_operator(op)
            for t, v in zip(outputs, values):
                if t is not None and v is not None:
                    t.data = v
                    t.shape = tuple(v.shape)
                    t.shape_signature = None
        elif (codes := unquantized_codes(op)) is not None:
            self.sg.remove_operator(op)
            raise self.fail(f"LiteRT's {op_type} takes {codes.dtype.name.lower()} operands as quantized values, and "
                            f"{codes.name!r} has no quantization parameters (LiteRT would compute with a zero scale "
                            "or abort); cast it to int32 first, or quantize the model")
        elif (refusal := _complex_refusal(op_type, [*inputs, *outputs]) or type_refusal(op)) is not None:
            self.sg.remove_operator(op)
            raise self.fail(refusal)
        if op_type != "CUSTOM":
            self.scope.importer.stats.lowered.setdefault(self.source, set()).add(op_type)
        return list(outputs)

    def emit1(self, op_type: str, inputs: Sequence[Tensor | None], output: Tensor | None = None,
              **options) -> Tensor:
        """`emit` for single-output ops; returns the output tensor."""
        return self.emit(op_type, inputs, None if output is None else [output], **options)[0]
