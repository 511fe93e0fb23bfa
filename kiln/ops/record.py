"""The op record: everything kiln knows about one builtin operator, in one place.

An `OpDef` holds the op's options (with the schema defaults), its version rule (the lowest
version its features need, as TensorFlow's op_version.cc decides), the first LiteRT release
that runs each version, its NumPy reference kernel, an optional shape rule and the facts
passes need (fused-activation host, side effects, subgraph fields). Op families live in one
module each (elementwise.py, nn.py, ...) and export a tuple ``OPS`` of records; what other
backends add per op (NumPy-delegate chains, XLA lowerings) registers in a
`backends.BackendTable`, keyed as the record dispatches its kernels (`operand_types`).

Kernel contract::

    def kernel(call: KernelCall, *inputs: np.ndarray | None) -> np.ndarray | tuple[np.ndarray, ...]

``inputs`` are the node's input arrays in operand order (None for an omitted optional
operand). The kernel returns one array per output, with the output's dtype
(``call.out_dtypes``). A reference kernel is a pure function of its inputs and options: it
never mutates its inputs and keeps nothing between calls (``KernelCall`` is read-only
context), so an XLA lowering can mirror it op for op and a delegate can replace it.

State an op updates (an LSTM's cell and hidden state, which LiteRT keeps in *variable
tensors* among the inputs) is declared by the record as ``state_operands``, the input
positions it updates. The kernel returns the new state values after its outputs: a tuple of
``len(call.out_dtypes)`` outputs (None for an output the node omits) followed by one value
per state operand, in declaration order (`with_state` builds it). The interpreter writes
those values into the state operands' tensors after the node ran; the XLA backend threads
them through its compiled function the same way.

Quantized nodes run the record's ``quantized`` kernels, keyed by operand types
(`operand_types`: "int8", "uint8", "int16" for integer-quantized activations, "hybrid"
for float activations with quantized weights). The interpreter picks a node's kernel once
when it prepares the node (`OpDef.kernel_for`); a node whose types have no kernel is
refused there, as LiteRT's Prepare refuses it.

A kernel that meets a case it does not support raises ``OpError`` saying what is unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..errors import OpError
from ..kernels.family import QUANTIZABLE, float_range, is_quantized, reject_quantized, with_state  # noqa: F401 - the families' names
from ..schema import BUILTIN_CODES, Activation, DType, options_defaults
from .traits import HYBRID, INT8, INT16, UINT8, MacRule, Quantization, Weights

if TYPE_CHECKING:  # pragma: no cover
    from ..ir import Operator, Tensor


class Runtime(Protocol):
    """What a kernel may ask of the interpreter running it (control flow, variables)."""

    def call_subgraph(self, index: int, inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...

    variables: dict  # resource id -> current value (a mapping: kiln/runtime/variables.py)
    call_once_done: set  # init subgraphs CALL_ONCE has run
    random_streams: dict  # a random op's generator position, by node (kiln/ops/random.py)

    def resource_id(self, container: str, shared_name: str) -> int: ...


@dataclass
class KernelCall:
    """Per-node context handed to a kernel; built once when the interpreter prepares a node.

    Attributes:
      opts: the op's builtin options as attributes, schema defaults filled in.
      op: the IR operator (input/output tensors with dtype, quantization, shape signature).
      out_dtypes: numpy dtype of each output.
      runtime: the interpreter, for control-flow and resource-variable ops.
    """

    opts: SimpleNamespace
    op: "Operator"
    out_dtypes: list[np.dtype]
    runtime: Runtime | None = None

    def in_quant(self, i: int):
        t = self.op.inputs[i]
        return None if t is None else t.quantization

    def out_quant(self, i: int = 0):
        t = self.op.outputs[i]
        return None if t is None else t.quantization


Kernel = Callable[..., Any]

#: Keys of `OpDef.quantized` (defined in traits.py): the element type of a node's quantized
#: activations — INT8, UINT8, INT16 — or HYBRID for float activations with quantized weights
#: (LiteRT's dynamic-range kernels).
#: The integer types a quantized activation may have.
CODE_TYPES = (INT8, UINT8, INT16)
_FLOATS = frozenset({DType.FLOAT32, DType.FLOAT16})


def operand_types(op: "Operator") -> str | None:
    """The key a node's kernel is chosen by: None without quantized operands (the float
    ``kernel`` runs), HYBRID for float output with quantized operands other than input 0,
    else the element type of the first quantized of input 0 and output 0 ("int8", ...)."""
    ins = [t for t in op.inputs if t is not None]
    outs = [t for t in op.outputs if t is not None]
    if not any(is_quantized(t) for t in (*ins, *outs)):
        return None
    first_in = op.inputs[0] if op.inputs else None
    if outs and outs[0].dtype in _FLOATS and not is_quantized(first_in):
        return HYBRID
    for t in (first_in, outs[0] if outs else None, *ins):
        if is_quantized(t):
            return t.dtype.name.lower()
    return HYBRID  # pragma: no cover - only outputs beyond the first are quantized


def unquantized_codes(op: "Operator", record: "OpDef") -> "Tensor | None":
    """The first int8 / uint8 / int16 operand of ``op`` without quantization parameters that
    LiteRT's kernel reads as quantized (`OpDef.reads_scales`): on such a node LiteRT computes
    with a zero scale — wrong values, or an abort (ADD, SUB, the comparisons). None: no such operand."""
    for t in (*op.inputs, *op.outputs):
        if t is not None and t.dtype in QUANTIZABLE and t.dtype != DType.INT4 and not is_quantized(t) \
                and record.reads_scales(t.dtype.name.lower()):
            return t
    return None


#: Every element type of a fixed size, by name: what a kernel that only moves bytes takes.
FIXED_SIZE = "bool float16 float32 float64 complex64 int8 uint8 int16 uint16 int32 uint32 int64 uint64"


def takes(names: str) -> frozenset[str]:
    """`OpDef.types` from their names ("float32 int32")."""
    return frozenset(names.split())


def type_refusal(op: "Operator", record: "OpDef") -> str | None:
    """Why LiteRT runs no node ``op``: its `OpDef.typed_operand` has a type outside
    `OpDef.types` (None: it has not, or the record does not say)."""
    i = record.typed_operand
    t = op.inputs[i] if record.types and i < len(op.inputs) else None
    if t is None or is_quantized(t) or t.dtype.name.lower() in record.types:
        return None
    return f"LiteRT's {op.op_type} takes no {t.dtype.name.lower()} operands ({', '.join(sorted(record.types))} only)"


def signature(op: "Operator") -> str:
    """A node's operand types as "(INT8, INT8, INT32) -> INT8" (None: an omitted operand)."""
    def name(t):
        return "None" if t is None else t.dtype.name
    return f"({', '.join(name(t) for t in op.inputs)}) -> {', '.join(name(t) for t in op.outputs)}"


def on_codes(kernel: "Kernel", types: Sequence[str] = CODE_TYPES) -> dict[str, "Kernel"]:
    """The ``quantized`` entry of an op that only moves, selects or compares values: its
    kernel runs unchanged on the integer codes (input and output share their parameters)."""
    return dict.fromkeys(types, kernel)


def on_numpy(fn: Callable) -> "Kernel":
    """The reference kernel of ``fn(xp, call, *inputs)``: an op's arithmetic written once over
    an array namespace, run here on NumPy (kiln.xla lowers the same ``fn`` over jax.numpy)."""
    def kernel(call, *inputs):
        return fn(np, call, *inputs)
    kernel.__name__ = kernel.__qualname__ = fn.__name__
    kernel.__module__ = fn.__module__
    return kernel


VersionRule = Callable[["Operator"], int]
ShapeRule = Callable[[SimpleNamespace, Sequence[tuple[int, ...]]], list[tuple[int, ...]]]


@dataclass(frozen=True)
class OptionsSpec:
    """A builtin options table and its fields with their schema defaults.

    ``table`` is the schema's table name ("Conv2DOptions"). ``defaults`` maps each field's
    snake_case name to its default; a tuple default marks an int32 vector field, a float
    default a float field, a bool default a bool field, an int default an integer or enum.
    """

    table: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def all_defaults(self) -> dict[str, Any]:
        """Every field of the table with its default: the schema's (read from the tflite
        bindings, so none is left out) overlaid with the record's typed ones (enums)."""
        return {**options_defaults(self.table), **self.defaults}


def _always_v1(op: "Operator") -> int:
    return 1


#: A version LiteRT's runtime_version.cc has no row for. Declared explicitly so that a
#: forgotten row is an error while these, like in TF's converter, leave the model's
#: min_runtime_version where the other ops put it.
UNLISTED = ""


@dataclass(frozen=True)
class OpDef:
    """One builtin operator: options, version rule, reference kernel, shape rule, and facts."""

    name: str
    kernel: Kernel | None
    options: OptionsSpec | None = None
    version: VersionRule = _always_v1
    #: Highest version the reference kernel implements (BuiltinOpResolver registers 1..max).
    max_version: int = 1
    #: Optional explicit shape rule: (opts, input shapes) -> output shapes. Without one,
    #: shapes are inferred by running the kernel (see kiln.ops.infer_output_shapes).
    shape: ShapeRule | None = None
    #: First LiteRT release running each version (index 0 is version 1), as runtime_version.cc;
    #: ``UNLISTED`` where that table has no row. Every version up to max_version needs an entry.
    runtime_versions: tuple[str, ...] = ()
    #: LiteRT's float kernel applies the fused_activation_function option, so a following
    #: RELU / RELU6 / RELU_N1_TO_1 can fold into it (passes.activation).
    fused_activation_host: bool = False
    #: Running it has an effect its outputs do not show (a variable write, a one-time init):
    #: never removed, folded or merged.
    side_effects: bool = False
    #: Its result is not a pure function of its inputs (it reads a variable): never folded or merged.
    stateful: bool = False
    #: Options fields that name a subgraph it calls (its effects are those of the subgraphs).
    subgraph_fields: tuple[str, ...] = ()
    #: Input positions holding state the op updates (variable tensors: LSTM/RNN states). The
    #: kernel returns their new values after its outputs; the interpreter writes them back.
    state_operands: tuple[int, ...] = ()

    #: Kernels for quantized operands, keyed by `operand_types` (INT8, UINT8, INT16, HYBRID);
    #: same contract as ``kernel``. A quantized node whose key is missing is refused.
    quantized: Mapping[str, Kernel] = field(default_factory=dict, hash=False)
    #: The op's kernel family (kiln.kernels.family): per operand-types key (None: float) a
    #: `Format` — ``prepare(call, inputs)`` then ``run(xp, prepared, *activations)`` — that
    #: ``kernel`` and ``quantized`` run on NumPy and every backend runs the same way (`family`).
    formats: Mapping[str | None, Any] = field(default_factory=dict, hash=False)

    #: Names of the input slots, in operand order ("input", "filter", "bias"; the fused
    #: LSTMs' layout is kiln.schema's). Empty where the positions need no names.
    operands: tuple[str, ...] = ()
    #: The operands holding constant weights (and the bias), quantized per channel along an
    #: axis (kiln.ops.traits.Weights).
    weights: Weights | None = None
    #: How the quantizer makes it integer and which integer / hybrid kernels LiteRT has for it
    #: (kiln.ops.traits.Quantization); None: it stays float in every quantized model.
    quantization: Quantization | None = None
    #: Multiply-accumulates of one execution (kiln.ops.traits.MacRule); None: it carries none.
    macs: MacRule | None = None
    #: Integer types LiteRT's kernel also takes as plain integers when they carry no quantization
    #: parameters, though its kernel for quantized ones rescales (int16 ADD, MUL, ABS).
    takes_raw: frozenset[str] = frozenset()
    #: The element types LiteRT runs the op on (input ``typed_operand`` without quantization
    #: parameters), read from its kernel and the op fuzz (tests/converter/test_op_fuzz.py; the
    #: default XNNPACK delegate runs some float16 ones); empty: not stated. kiln's converter
    #: writes the op for no other type, as TF's does not, and the LiteRT delegate leaves such
    #: nodes to kiln's kernels.
    types: frozenset[str] = frozenset()
    typed_operand: int = 0

    # -- what it does to its data, for passes and backends that move ops around --------------
    #: Its output is input 0's data in another shape, in the same order (RESHAPE, SQUEEZE,
    #: EXPAND_DIMS): a channel-keeping reshape between two ops changes nothing they compute.
    reshapes: bool = False
    #: It reads only its input's shape, never the values (SHAPE, RANK).
    reads_shape_only: bool = False
    #: It moves a value between representations and computes nothing (QUANTIZE, DEQUANTIZE, CAST).
    converts: bool = False
    #: It reduces input 0 over the axes in input 1 (an axis of size 1 reduces nothing).
    reduces: bool = False
    #: The fused_activation_function a producer applies in its place (RELU: Activation.RELU).
    fuses_as: Activation | None = None
    #: It reads or writes resource variables, or runs the init subgraph that creates them.
    resource: bool = False

    @property
    def calls_subgraphs(self) -> bool:
        """It runs other subgraphs (WHILE, IF, CALL_ONCE): it cannot be cut out of its model."""
        return bool(self.subgraph_fields)

    def operand(self, name: str) -> int:
        """The position of the input slot called ``name``."""
        try:
            return self.operands.index(name)
        except ValueError:
            raise OpError(f"{self.name} has no operand {name!r} (its operands: "
                          f"{', '.join(self.operands) or 'unnamed'})") from None

    def kernel_for(self, op: "Operator") -> Kernel:
        """The kernel that runs node ``op``, chosen by its operand types (`operand_types`)."""
        key = operand_types(op)
        if key is None:
            return self.kernel
        kernel = self.quantized.get(key)
        if kernel is None:
            have = ", ".join(sorted(self.quantized)) or "none"
            raise OpError(f"{self.name} has no kernel for {key} operands {signature(op)} "
                          f"(kiln's quantized {self.name} kernels: {have})")
        return kernel

    def reads_scales(self, key: str) -> bool:
        """Whether LiteRT's kernels take ``key`` (int8 / uint8 / int16) operands of this op as
        quantized values, reading their scales: the record's kernel for them is a rescaling one,
        not its float kernel on the codes — or it has none for ``key`` but a rescaling one for
        another integer type (LiteRT's uint8 kernels are its legacy quantized ones) — unless
        `takes_raw` names ``key`` or the op only requantizes between differing parameters."""
        if key in self.takes_raw or (self.quantization is not None and self.quantization.output.value == "requantize"):
            return False  # CONCATENATION / PACK rescale nothing where every operand shares (no) parameters
        kernel = self.quantized.get(key)
        if kernel is not None:
            return kernel is not self.kernel
        return any(k is not self.kernel for t, k in self.quantized.items() if t in CODE_TYPES)

    def runtime_version(self, version: int) -> str:
        """First LiteRT release that runs ``version`` ("" when UNLISTED); a missing row raises."""
        if not 1 <= version <= len(self.runtime_versions):
            raise OpError(f"{self.name} version {version} has no runtime version in its op record "
                          f"(it lists versions 1..{len(self.runtime_versions)}); add it to runtime_versions")
        return self.runtime_versions[version - 1]

    @property
    def code(self) -> int:
        return BUILTIN_CODES[self.name]

    @property
    def option_defaults(self) -> Mapping[str, Any]:
        """Every option the op declares, with its schema default (empty without a table)."""
        return self.options.all_defaults if self.options else {}

    def make_options(self, given: Mapping[str, Any] | None = None) -> SimpleNamespace:
        """Options namespace: schema defaults overridden by the operator's stored values."""
        values = dict(self.option_defaults)
        if given:
            values.update(given)
        return SimpleNamespace(**values)


# -- helpers shared by the op families ------------------------------------------------------

def family(formats: Mapping[str | None, Any]) -> dict[str, Any]:
    """An OpDef's kernels from its kernel family: ``kernel`` (the float format's reference
    kernel), ``quantized`` (the others') and ``formats`` (the family, for the backends)."""
    kernels = {key: fmt.kernel for key, fmt in formats.items()}
    return {"kernel": kernels.pop(None), "quantized": kernels, "formats": formats}


def apply_activation(x: np.ndarray, act: int, xp=np) -> np.ndarray:
    """Apply a fused activation function (ActivationFunctionType) to a float result (over
    array namespace ``xp``)."""
    if act == Activation.NONE:
        return x
    if act == Activation.RELU:
        return xp.maximum(x, 0).astype(x.dtype, copy=False)
    if act == Activation.RELU6:
        return xp.clip(x, 0, 6).astype(x.dtype, copy=False)
    if act == Activation.RELU_N1_TO_1:
        return xp.clip(x, -1, 1).astype(x.dtype, copy=False)
    if act == Activation.TANH:
        return xp.tanh(x).astype(x.dtype, copy=False)
    if act == Activation.SIGN_BIT:
        return xp.signbit(x).astype(x.dtype)
    raise OpError(f"unknown fused activation function {act}")


def input_dtype(op: "Operator", i: int = 0) -> DType | None:
    """Element type of input ``i`` (None when the operand is omitted or absent)."""
    if i >= len(op.inputs) or op.inputs[i] is None:
        return None
    return op.inputs[i].dtype


def output_dtype(op: "Operator", i: int = 0) -> DType | None:
    if i >= len(op.outputs) or op.outputs[i] is None:
        return None
    return op.outputs[i].dtype


def input_rank(op: "Operator", i: int = 0) -> int:
    if i >= len(op.inputs) or op.inputs[i] is None:
        return 0
    return len(op.inputs[i].shape)


# -- fused activations and quantized operands, for every family's kernels ----------------------

def activation_range(act: int, dtype: np.dtype) -> tuple:
    """The (min, max) clamp LiteRT applies for a fused activation on ``dtype`` outputs
    (kiln.kernels.family.float_range, kept per (activation, type))."""
    return _activation_range(act, np.dtype(dtype))


@lru_cache(maxsize=None)
def _activation_range(act: int, dtype: np.dtype) -> tuple:
    return float_range(act, dtype)


def clamp_activation(x: np.ndarray, act: int, *, in_place: bool = False) -> np.ndarray:
    """Apply a fused activation the way LiteRT's arithmetic kernels do (a clamp).

    ``in_place`` lets the clamp overwrite ``x`` (a fresh result the caller owns).
    """
    kind = x.dtype.kind
    if kind == "f":
        lo, hi = _activation_range(act, x.dtype)
        return x.clip(lo, hi, out=x if in_place else None)  # np.clip, without its wrappers
    if kind in "iu" and act == Activation.NONE:
        return x
    if x.dtype == np.bool_ or kind == "c" or not np.issubdtype(x.dtype, np.number):
        return x  # LiteRT's complex64 MUL applies no activation
    if np.issubdtype(x.dtype, np.integer) and act == Activation.NONE:
        return x
    lo, hi = activation_range(act, x.dtype)
    return np.clip(x, lo, hi).astype(x.dtype, copy=False)
