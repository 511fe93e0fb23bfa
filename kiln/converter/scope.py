"""`Scope`: one TensorFlow graph being imported into one IR subgraph, and the `Legalization`
tables the importer is handed.

This module sits between the emitters (kiln/converter/legalize, kiln/converter/keras) and the
`Importer`: both import it, neither imports the other. The pipeline assembles the tables
(`kiln.converter.pipeline.legalization`) and gives them to the importer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from ..errors import ConversionError
from ..ir import Subgraph, Tensor

if TYPE_CHECKING:  # pragma: no cover
    from .context import EmitContext
    from .importer import Importer

#: An emitter turns the TF op of an `EmitContext` into IR (see kiln/converter/context.py).
Emitter = Callable[["EmitContext"], Any]


@dataclass(frozen=True)
class Legalization:
    """What the importer legalises with.

    Attributes:
      emitters: TF op type -> emitter.
      match_patterns: ``(scope, ops) -> (anchor op name -> Pending, names to skip)``: TF-level
        patterns claiming groups of ops.
      function_call: the emitter for a call of a library function (fused or inlined).
      loop_fusions: asked in turn for every While before it becomes a WHILE op; each returns
        None (not its loop), raises NotFusable (its loop, not fusable: the reason is reported)
        or returns the fused outputs with report lines (``.values``, ``.notes``).
    """

    emitters: Mapping[str, Emitter]
    match_patterns: Callable[["Scope", list], tuple[dict, set]]
    function_call: Emitter
    loop_fusions: tuple[Callable, ...] = ()


#: TF ops with effects beyond their outputs: imported even when no output is used.
SIDE_EFFECT_TF_OPS = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterNdUpdate", "ResourceScatterNdAdd",
    "ResourceScatterNdSub",
})
#: TF ops that write the variable given as their first input.
WRITE_TF_OPS = SIDE_EFFECT_TF_OPS | frozenset({"DestroyResourceOp"})


@dataclass
class Pending:
    """An op claimed by a TF-level pattern: the anchor emits, interior ops are skipped."""

    emit: Emitter
    label: str


class Scope:
    """One TF graph being imported into one IR subgraph (inlined calls get a child scope)."""

    def __init__(self, importer: "Importer", graph, sg: Subgraph, prefix: str = ""):
        self.importer = importer
        self.graph = graph
        self.sg = sg
        self.prefix = prefix
        self.values: dict[str, Any] = {}
        #: per-subgraph caches (constants of read-only variables, VAR_HANDLE outputs)
        self.cache: dict = importer.subgraph_cache(sg)

    def bind(self, tf_tensor, value) -> None:
        self.values[tf_tensor.name] = value

    def lookup(self, tf_tensor):
        try:
            return self.values[tf_tensor.name]
        except KeyError:  # the graph reads a tensor the import never bound: say which
            raise ConversionError(
                f"no value for tensor {tf_tensor.name!r} (op {tf_tensor.op.type}) while importing "
                f"{self.sg.name!r}") from None

    def has(self, tf_tensor) -> bool:
        return tf_tensor.name in self.values

    # -- import --------------------------------------------------------------------------------
    def run(self, outputs: Iterable) -> list:
        """Import every op the ``outputs`` (and side effects) depend on; their values."""
        outputs = list(outputs)
        ops = live_ops(self.graph, outputs)
        claimed, skipped = self.importer.legalization.match_patterns(self, ops)
        for op in ops:
            if op.name in skipped:
                continue
            if all(self.has(t) for t in op.outputs) and op.outputs:
                continue  # bound from outside (function arguments)
            self.importer.import_op(self, op, claimed.get(op.name))
        return [self.lookup(t) for t in outputs]


def live_ops(graph, outputs) -> list:
    """Ops that ``outputs`` depend on (data and control edges) plus side-effecting ops, in a
    topological order that follows graph creation order where it can."""
    all_ops = graph.get_operations()
    position = {op.name: i for i, op in enumerate(all_ops)}
    stack = [t.op for t in outputs]
    stack += [op for op in all_ops if op.type in SIDE_EFFECT_TF_OPS]
    seen: set[str] = set()
    live = []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        live.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    live.sort(key=lambda o: position.get(o.name, 0))
    # Creation order is topological for traced graphs; verify and repair if not.
    done: set[str] = set()
    ordered = []
    pending = live
    while pending:
        rest = []
        for op in pending:
            deps = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
            if all(d in done or d not in seen for d in deps):
                ordered.append(op)
                done.add(op.name)
            else:
                rest.append(op)
        if len(rest) == len(pending):
            raise ConversionError(f"graph has a cycle through {rest[0].name!r}")
        pending = rest
    return ordered


def distinct_outputs(sg: Subgraph, outputs: list[Tensor], suffixes: list[str], *,
                     constants: bool = False) -> list[Tensor]:
    """``outputs`` with every repeated one replaced by a copy made by an op, so each output of a
    graph is a tensor of its own; an input may stand as an output directly (TF's converter writes
    a pass-through model with no ops at all). A constant output stays a constant when
    ``constants`` (a signature's outputs: TF's converter folds ``tf.shape`` of a static shape to
    a constant output and writes no op), else it is copied too (a control-flow body's outputs
    are values its op writes). The copy of ``t`` is a RESHAPE named ``t.name/suffix``."""
    seen: set[int] = set()
    result = []
    for t, suffix in zip(outputs, suffixes):
        if (t.is_constant and not constants) or id(t) in seen:
            copy = sg.add_tensor(f"{t.name}/{suffix}", t.dtype, t.shape, shape_signature=t.shape_signature)
            if t.is_constant:  # a RESHAPE to its own static shape: a cheap op LiteRT keeps
                shape = sg.add_constant(f"{t.name}/shape", np.asarray(t.shape, np.int32))
                sg.add_operator("RESHAPE", [t, shape], [copy], options={"new_shape": tuple(t.shape)})
            else:
                shape = sg.add_constant(f"{t.name}/shape", np.asarray(t.signature, np.int32))
                sg.add_operator("RESHAPE", [t, shape], [copy])
            t = copy
        seen.add(id(t))
        result.append(t)
    return result
