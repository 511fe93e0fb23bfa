"""What a kernel family is, and what its ``prepare`` reads from a node.

LiteRT splits every kernel into Prepare (per node: checks, multipliers, weight layout,
geometry) and Eval (per run). A weighted or windowed op's kernel here is split the same way,
per number format: `Format` holds ``prepare(call, inputs) -> Prepared`` (NumPy, no run-time
data: constants have their values, the other operands only their shape and dtype) and
``run(xp, prepared, *activations)``, written over an array namespace ``xp``. Each backend
differs only in *when* it calls them:

* the reference kernel (`Format.kernel`, the record's): both, on every call, on NumPy;
* the NumPy delegate: prepare when it plans a partition, run on each invoke;
* XLA: prepare while tracing (shapes and constants are static there), run on jax.numpy.

A family is a mapping operand-types key (None for float, "int8", "int16", "uint8", "hybrid",
as `kiln.ops.record.operand_types` names them) -> `Format`. ``call`` is the node's
`kiln.ops.record.KernelCall`, read duck-typed (options, operands' quantization, output types),
so kiln.kernels stays below kiln.ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import OpError
from ..schema import Activation, DType
from .fixedpoint import IntegerKernelError


#: The operand-types keys (kiln.ops.record.operand_types) of the quantized formats.
INT8, INT16, UINT8, HYBRID = "int8", "int16", "uint8", "hybrid"


@dataclass(frozen=True)
class Format:
    """One op's kernel at one number format: ``prepare(call, inputs)`` then ``run(xp, prepared,
    *activations)``, ``activations`` naming the operand positions ``run`` takes."""

    prepare: Callable
    run: Callable
    activations: tuple[int, ...] = (0,)

    def kernel(self, call, *inputs):
        """The reference kernel: prepare and run on NumPy, on every call (nothing kept)."""
        prepared = self.prepare(call, inputs)
        return self.run(np, prepared, *[operand(inputs, i) for i in self.activations])


@dataclass(frozen=True)
class Shaped:
    """An operand whose value prepare does not see (a backend's run-time input): its shape and
    type only, as the NumPy delegate hands them to prepare when it plans."""

    shape: tuple
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def known(a) -> bool:
    """Whether prepare sees operand ``a``'s value (a NumPy array: a constant, or anything the
    reference kernel is handed), not only its shape (`Shaped`, a traced array)."""
    return isinstance(a, np.ndarray)


#: Element types that hold quantized codes.
QUANTIZABLE = frozenset({DType.INT8, DType.UINT8, DType.INT16, DType.INT4})


def is_quantized(tensor) -> bool:
    """An integer tensor with affine quantization parameters."""
    if tensor is None or tensor.dtype not in QUANTIZABLE:
        return False
    q = tensor.quantization
    return q is not None and q.scale.size > 0


def reject_quantized(call, *, shared_ok: bool = False) -> None:
    """Refuse quantized operands (no quantized kernel yet).

    With ``shared_ok`` an op that only compares, selects or moves raw values accepts them
    when every quantized input and output uses the same scale and zero point, because its
    result on the raw integers is then exactly the quantized result.
    """
    op = call.op
    tensors = [t for t in (*op.inputs, *op.outputs) if t is not None]
    quantized = [t for t in tensors if t.dtype in QUANTIZABLE and is_quantized(t)]
    if not quantized:
        return
    if shared_ok:
        first = quantized[0].quantization
        ints = [t for t in tensors if t.dtype in QUANTIZABLE]
        if len(ints) == len(quantized) and all(t.quantization == first for t in quantized):
            return
    t = quantized[0]
    raise OpError(
        f"{call.op.name}: quantized kernel not implemented yet (tensor {t.name!r} is "
        f"{t.dtype.name} with quantization parameters)"
    )


def operand(inputs, i: int):
    """Operand ``i`` of ``inputs`` (None where the node omits it)."""
    return inputs[i] if i < len(inputs) else None


def params(call, i: int, what: str, *, per_tensor: bool = True):
    """Input ``i``'s (or, with i < 0, the output's) QuantParams, checked."""
    t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
    q = None if t is None else t.quantization
    if q is None or q.scale.size == 0:
        raise OpError(f"{call.op.name}: {what} {t.name if t is not None else ''!r} has no quantization "
                      "parameters")
    if per_tensor and q.scale.size != 1:
        raise OpError(f"{call.op.name}: {what} {t.name!r} is quantized per channel ({q.scale.size} "
                      "scales); this kernel takes one scale")
    return q


def out_params(call):
    return params(call, -1, "output")


def int16_zero_points(call, *indices: int) -> None:
    """16x8 kernels take symmetric int16 activations (LiteRT checks zero point 0)."""
    for i in indices:
        t = call.op.outputs[0] if i < 0 else call.op.inputs[i]
        if t is not None and t.quantization is not None and np.any(t.quantization.zero_point):
            raise OpError(f"{call.op.name}: int16 tensor {t.name!r} has zero point "
                          f"{int(t.quantization.zero_point[0])}; 16x8 kernels need 0")


def fused_activation(call) -> Activation:
    return Activation(call.opts.fused_activation_function)


def with_state(call, outputs, states) -> tuple:
    """A stateful kernel's result: its outputs padded to the node's output count (None for an
    output the node omits), then the new values of the record's ``state_operands``."""
    n = len(call.out_dtypes)
    if len(outputs) > n:
        raise OpError(f"{call.op.name}: computed {len(outputs)} outputs but the node has {n}")
    return (*outputs, *([None] * (n - len(outputs))), *states)


def broadcast(call, a, b) -> None:
    """Refuse operands that do not broadcast, naming the node."""
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise OpError(f"{call.op.name}: shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None


def checked(call, fn, *args, **kwargs):
    """``fn``'s refusals (`IntegerKernelError`) as the node's OpError."""
    try:
        return fn(*args, **kwargs)
    except IntegerKernelError as exc:
        raise OpError(f"{call.op.name}: {exc}") from exc


# -- float operands and results ------------------------------------------------------------------

#: bfloat16's largest finite value (NumPy has no finfo for it).
BFLOAT16_MAX = float.fromhex("0x1.fep127")


def float_range(act: int, dtype) -> tuple:
    """The (min, max) clamp LiteRT applies for a fused activation on ``dtype`` outputs
    (CalculateActivationRange: TANH and SIGN_BIT have no range of their own and fall back to
    the type's limits, like NONE)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":     # a traced backend's dtype policy: its own finite range
        lo, hi = -BFLOAT16_MAX, BFLOAT16_MAX
    else:
        info = np.finfo(dtype) if np.issubdtype(dtype, np.floating) else np.iinfo(dtype)
        lo, hi = info.min, info.max
    if act == Activation.RELU:
        return 0, hi
    if act == Activation.RELU6:
        return 0, 6
    if act == Activation.RELU_N1_TO_1:
        return -1, 1
    if act in (Activation.NONE, Activation.TANH, Activation.SIGN_BIT):
        return lo, hi
    raise OpError(f"unknown fused activation function {act}")


def float_dtype(call, x, what: str) -> np.dtype:
    """The type a float kernel computes ``x`` in: float64 stays float64 (and bfloat16, which a
    traced backend's dtype policy gives, stays bfloat16), any other float is float32; other
    types are refused."""
    dtype = np.dtype(x.dtype)
    if dtype.kind != "f" and dtype.name != "bfloat16":
        raise OpError(f"{call.op.name}: {what} of type {dtype} is not supported (float only)")
    return dtype if dtype in (np.float64,) or dtype.name == "bfloat16" else np.dtype(np.float32)


def as_float(x, dtype):
    """``x`` in ``dtype`` (no copy when it is already)."""
    return x if x.dtype == dtype else x.astype(dtype)


def nhwc(call, shape, what: str = "input") -> tuple[int, ...]:
    if len(shape) != 4:
        raise OpError(f"{call.op.name}: {what} must be 4-D NHWC, got shape {list(shape)}")
    return tuple(shape)


def float_bias(call, bias, channels: int):
    """A float kernel's bias [channels] in its type (float64 kept, else float32), checked;
    None without one, or where prepare does not see its value (`run_bias` then)."""
    if bias is None:
        return None
    float_dtype(call, bias, "bias")
    size = int(np.prod(bias.shape))
    if size != channels:
        raise OpError(f"{call.op.name}: bias has {size} elements for {channels} output channels")
    return as_float(np.asarray(bias), float_dtype(call, bias, "bias")).reshape(-1) if known(bias) else None


def run_bias(prepared, bias):
    """The bias a run adds: the prepared one, else the operand it is handed (a traced value)."""
    return prepared if prepared is not None or bias is None else bias.reshape(-1)


def finish_float(xp, y, bias, lo, hi, out_dtype):
    """A float kernel's output stage: bias over the channel axis, the fused activation's clamp
    (LiteRT's float kernels clamp even for NONE, to ±FLT_MAX), the output type. On NumPy ``y``
    is a scratch array the kernel owns and is changed in place."""
    if xp is np:
        if bias is not None:
            y += bias
        y.clip(lo, hi, out=y)   # np.clip, without its wrappers
        return y.astype(out_dtype, copy=False)
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return xp.clip(y, xp.asarray(lo, y.dtype), xp.asarray(hi, y.dtype)).astype(out_dtype)
