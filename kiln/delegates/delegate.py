"""kiln's default delegate: one NumPy delegate for float, integer and hybrid nodes.

What it runs is one backend table (kiln.ops.backends), `LOWERINGS`, keyed as the records
dispatch their kernels: (op, `FLOAT`) entries run in the float chains of compiled.py (float32
nodes, pre-packed weights, buffers planned per input shape); (op, "int8" / "uint8" / "int16"
/ "hybrid") entries run in the integer chains of quantized.py (per-node steps prepared by one
checked run, bit-exact with the reference kernels). From the interpreter's side it is one
delegate: a partition may mix float and integer nodes (QUANTIZE → int8 ops → DEQUANTIZE →
float ops), and its kernel runs each run of one kind as that kind's chain, in order.

Every entry's lowering reproduces its reference kernel bit for bit; an op registered without
one runs its reference kernel inside the chain, so a partition never returns to the
interpreter for it.
"""

from __future__ import annotations

from itertools import groupby
from typing import Iterable, Sequence

import numpy as np

from .. import ops
from ..errors import UnsupportedError
from ..ops.backends import FLOAT, KEYS, BackendTable, key_name
from ..ops.record import HYBRID, operand_types
from ..runtime.delegate import DelegateKernel, NodeInfo, Partition, ReportingDelegate
from . import float_lowerings as flt
from . import more_lowerings as more
from .compiled import ChainKernel, CompiledSupport, Node, lower_binary, lower_family, lower_view
from .quantized import (
    CODE_TYPES,
    Lowering,
    QuantizedChain,
    QuantizedSupport,
    lower_binary_table,
    lower_unary_table,
)
from .quantized import lower_family as lower_codes_family
from .quantized import lower_view as lower_code_view

def register_float(name: str, support: CompiledSupport, *, override: bool = False) -> None:
    """Run ``name``'s float32 nodes in the float chains (``support.lower``; None: its reference
    kernel inside the chain), at ``support.versions``."""
    LOWERINGS.register(name, support, check=support.check, override=override)


def register_quantized(name: str, support: QuantizedSupport, types: Iterable[str] = CODE_TYPES, *,
                       override: bool = False) -> None:
    """Run ``name``'s nodes with ``types`` operands in the integer chains."""
    LOWERINGS.register(name, support, types=types, check=support.check, override=override)


def _by_input(integer: Lowering, from_float: Lowering) -> Lowering:
    """QUANTIZE: one key (its output's type) whether its input is integer (a requantization)
    or float."""
    def lower(node: Node):
        return (from_float if node.ins[0].dtype == np.float32 else integer)(node)
    return lower


def fill(table: BackendTable) -> None:
    """The delegate's table: every (op, operand types) it runs and how — the one place kiln's
    entries are made (`LOWERINGS` calls it on first use: the delegate's constructor)."""
    def f(names, versions=(1,), const_operands=(), lower=None, constant_data=None):
        data = lower is None if constant_data is None else constant_data   # a kernel takes constants
        for name in names:
            support = CompiledSupport(frozenset(versions), tuple(const_operands), lower, data)
            table.register(name, support, check=support.check)

    def q(names, lower=None, const_operands=(), types=CODE_TYPES, constant_data=False, shape_operands=()):
        for name in names:   # the keys the op has reference kernels for: what the chain checks against
            keys = [k for k in types if k in ops.require(name).quantized]
            support = QuantizedSupport(tuple(const_operands), lower, constant_data, tuple(shape_operands))
            table.register(name, support, types=keys, check=support.check)

    # float32 nodes (kernel families: their float format, prepared when a partition is planned)
    f(["FULLY_CONNECTED"], (1, 5, 6), (1, 2), lower_family)   # plain, keep_num_dims, no bias
    f(["CONV_2D"], (1,), (1, 2), lower_family)
    f(["DEPTHWISE_CONV_2D"], (1, 2), (1, 2), lower_family)          # 2: dilation
    for name, ufunc in (("ADD", np.add), ("SUB", np.subtract), ("MUL", np.multiply)):
        f([name], lower=lower_binary(ufunc), constant_data=True)
    f(["RESHAPE", "EXPAND_DIMS"], const_operands=(1,), lower=lower_view)
    f(["SQUEEZE"], lower=lower_view)
    f(["MEAN"], const_operands=(1,), lower=lower_family)
    f(["MAX_POOL_2D", "AVERAGE_POOL_2D"], lower=lower_family)
    f(["UNIDIRECTIONAL_SEQUENCE_LSTM"], const_operands=flt.LSTM_WEIGHTS, lower=flt.lower_uni_lstm)
    f(["STRIDED_SLICE"], const_operands=(1, 2, 3), lower=flt.lower_strided_slice)
    f(["REVERSE_V2"], const_operands=(1,), lower=flt.lower_reverse)
    f(["TRANSPOSE"], const_operands=(1,), lower=flt.lower_transpose)
    f(["BATCH_MATMUL"], lower=lower_family, constant_data=True)
    f(["SOFTMAX"], lower=flt.lower_softmax)
    f(["RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH", "GELU", "CONCATENATION",
       "SQUARED_DIFFERENCE", "RSQRT", "NEG"])                              # their kernels, in the chain
    # integer and hybrid nodes (kernel families: prepared on the partition's first run)
    for types in (CODE_TYPES, (HYBRID,)):
        q(["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"], lower_codes_family, (1, 2), types=types)
        q(["TRANSPOSE_CONV"], lower_codes_family, (0, 1, 3), types=types, constant_data=True, shape_operands=(0,))
    q(["BATCH_MATMUL"], lower_codes_family, constant_data=True)
    q(["MAX_POOL_2D", "AVERAGE_POOL_2D"], lower_codes_family)
    q(["MEAN"], lower_codes_family, (1,), shape_operands=(1,))
    q(["ADD", "SUB", "MUL", "SQUARED_DIFFERENCE"], lower_binary_table, types=("int8", "uint8"), constant_data=True)
    q(["ADD", "SUB", "MUL", "SQUARED_DIFFERENCE"], more.lower_binary_int16, types=("int16",), constant_data=True)
    q(["LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "GELU", "HARD_SWISH", "DEQUANTIZE",
       "RSQRT", "EXP", "LOG", "ABS"], lower_unary_table)
    q(["QUANTIZE"], _by_input(lower_unary_table, more.lower_quantize_float))
    q(["RESHAPE", "EXPAND_DIMS"], lower_code_view, (1,), shape_operands=(1,))
    q(["SQUEEZE"], lower_code_view)
    q(["TRANSPOSE"], more.lower_transpose, (1,), shape_operands=(1,))
    q(["SOFTMAX"], more.lower_softmax)
    q(["CONCATENATION"], more.lower_concatenation, constant_data=True)
    q(["PACK"], more.lower_pack, constant_data=True)
    q(["STRIDED_SLICE", "REVERSE_V2", "UNIDIRECTIONAL_SEQUENCE_LSTM"])            # their kernels, in the chain
    q(["UNIDIRECTIONAL_SEQUENCE_LSTM"], types=(HYBRID,))                          # its hybrid kernel, likewise


#: What the NumPy delegate runs, per (op, operand types): `fill`'s entries and any registered since.
LOWERINGS: BackendTable = BackendTable("numpy delegate", fill=fill)


def _is_float(info: NodeInfo) -> bool:
    return operand_types(info.op) is FLOAT


class MixedChain(DelegateKernel):
    """A partition of float and integer nodes: each run of one kind is that kind's chain (a
    sub-partition of its own), and the runs pass each other their values in order."""

    def __init__(self, delegate: "NumpyDelegate", partition: Partition, runs: list[list[NodeInfo]]):
        consumers = [{id(t) for info in run for t in info.op.inputs if t is not None} for run in runs]
        leaving = {id(t) for t in partition.outputs}
        self.parts = []
        for k, run in enumerate(runs):
            produced = {id(t) for info in run for t in info.op.outputs if t is not None}
            inputs, seen = [], set()
            for info in run:
                for t in info.op.inputs:
                    if t is not None and id(t) not in produced and not t.is_constant and id(t) not in seen:
                        seen.add(id(t))
                        inputs.append(t)
            later = set().union(leaving, *consumers[k + 1:])
            outputs = [t for info in run for t in info.op.outputs
                       if t is not None and (id(t) in later or t.is_variable)]
            position = {id(t): i for i, t in enumerate(inputs)}
            states = [position[id(info.op.inputs[s])] for info in run
                      for s in info.registration.record.state_operands
                      if s < len(info.op.inputs) and info.op.inputs[s] is not None and id(info.op.inputs[s]) in position]
            sub = Partition(run, inputs, outputs, sorted(set(states)), partition.runtime)
            kernel = (ChainKernel if _is_float(run[0]) else QuantizedChain)(delegate, sub)
            self.parts.append((kernel, [id(t) for t in inputs], [id(t) for t in outputs],
                               [id(inputs[s]) for s in sub.state_inputs]))
        self.inputs = [id(t) for t in partition.inputs]
        self.outputs = [id(t) for t in partition.outputs]
        self.states = [id(partition.inputs[s]) for s in partition.state_inputs]

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        values = dict(zip(self.inputs, inputs))
        for kernel, ins, outs, states in self.parts:
            result = kernel.invoke([values[i] for i in ins])
            values.update(zip(outs, result))
            values.update(zip(states, result[len(outs):]))
        return [values[i] for i in self.outputs] + [values[i] for i in self.states]


class NumpyDelegate(ReportingDelegate):
    """Claims the nodes `LOWERINGS` runs (float32 at the versions it knows, integer, hybrid);
    runs each partition as pre-packed NumPy chains, bit for bit the reference kernels'.

    Args:
      ops: restrict the delegate to these op names (default: every op in `LOWERINGS`).
      types: restrict it to nodes with these operand types (`kiln.ops.backends.KEYS`: None for
        float, "int8", "uint8", "int16", "hybrid"; default: every one).

    After an interpreter prepares, ``claimed`` lists (node index, op name, version) of the
    nodes taken, ``rejected`` maps refused nodes to the reason and ``decisions`` holds every
    verdict as a `kiln.rules.Decision`; ``lowered`` holds (node index, op name) of integer
    nodes that run a lowering (the others run their reference kernel in the chain), and
    ``fallbacks`` maps (op name, node label) to why an integer node's lowering was dropped.
    """

    name = "numpy"

    def __init__(self, ops: Iterable[str] | None = None, types: Iterable[str | None] | None = None):
        known = set(LOWERINGS.ops())
        chosen = frozenset(known if ops is None else ops)
        if chosen - known:
            raise UnsupportedError(f"the NumPy delegate has no lowering for {sorted(chosen - known)}; it runs "
                                   f"{sorted(known)}")
        kinds = frozenset(KEYS if types is None else types)
        if kinds - set(KEYS):
            raise UnsupportedError(f"the NumPy delegate's operand types are {[key_name(k) for k in KEYS]}, "
                                   f"not {sorted(map(str, kinds - set(KEYS)))}")
        super().__init__()
        self.ops, self.types = chosen, kinds
        self.lowerings = LOWERINGS
        self.fallbacks: dict[tuple[str, str], str] = {}
        self.lowered: set[tuple[int, str]] = set()

    def why_not(self, node: NodeInfo) -> str | None:
        op, name = node.op, node.name
        if op.op_type == "CUSTOM" or name not in self.ops:
            return f"{name} is not an op this delegate runs"
        key = operand_types(op)
        if key not in self.types:
            return f"{name} with {key_name(key)} operands is left out of this delegate's operand types"
        reg = node.registration
        record = getattr(reg, "record", None)
        if record is None or reg.kernel is None or reg.kernel is not record.kernel:
            return f"{name} is overridden by a Python registration"
        return LOWERINGS.why_not(op)

    def make_kernel(self, partition: Partition) -> DelegateKernel:
        runs = [list(run) for _, run in groupby(partition.nodes, key=_is_float)]
        if len(runs) == 1:
            return (ChainKernel if _is_float(runs[0][0]) else QuantizedChain)(self, partition)
        return MixedChain(self, partition, runs)
