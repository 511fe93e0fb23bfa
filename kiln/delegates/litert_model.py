"""A LiteRT partition as a model of its own: the .tflite the LiteRT delegate hands LiteRT.

A partition's nodes are copied into subgraph 0 of a new IR model: the tensors the partition
reads from outside become its inputs (variable tensors stay variables, so LiteRT's kernels
update them in place), the tensors read after it become its outputs, and constants keep
their data (the same arrays: nothing is copied until kiln's writer serialises the model).
Subgraphs that WHILE / IF / CALL_ONCE call are copied whole, after it, with the operators'
subgraph indices renumbered. Everything goes through the IR and kiln's writer, so the file
is exactly what kiln would write for such a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import ops
from ..errors import ModelError
from ..ir import Model, Operator, Subgraph, Tensor


def called_subgraphs(op: Operator) -> list[Subgraph]:
    """The subgraphs ``op`` calls (its options' subgraph fields), in field order."""
    fields = ops.subgraph_fields(op)
    model = op.subgraph.model if op.subgraph is not None else None
    if not fields or model is None:
        return []
    found = []
    for name in fields:
        index = op.options[name]
        for k in ([index] if isinstance(index, int) else list(index or ())):
            if not 0 <= k < len(model.subgraphs):
                raise ModelError(f"{op.name} names subgraph {k}; the model has {len(model.subgraphs)}")
            found.append(model.subgraphs[k])
    return found


def reachable_subgraphs(nodes: Sequence[Operator]) -> list[Subgraph]:
    """Every subgraph the operators call, directly or through the subgraphs they call."""
    seen: dict[int, Subgraph] = {}
    pending = [sg for op in nodes for sg in called_subgraphs(op)]
    while pending:
        sg = pending.pop(0)
        if id(sg) not in seen:
            seen[id(sg)] = sg
            pending.extend(s for op in sg.operators for s in called_subgraphs(op))
    return list(seen.values())


@dataclass
class PartitionModel:
    """The model of one partition. ``inputs[k]`` / ``outputs[k]`` / ``variables[k]``: the
    index, in its subgraph 0, of the partition's k-th input / output / variable tensor
    (``variables`` follows ``variable_inputs``, positions in the partition's inputs)."""

    model: Model
    inputs: list[int]
    outputs: list[int]
    variable_inputs: list[int]
    variables: list[int]


class _Copier:
    """Copies operators into the partition model, renumbering the subgraphs they call."""

    def __init__(self, source: Model, callees: Sequence[Subgraph]):
        self.source = source
        self.model = Model("kiln LiteRT partition")
        self.main = self.model.add_subgraph("partition")
        self.renumber = {id(sg): k + 1 for k, sg in enumerate(callees)}  # callees follow subgraph 0

    def operator(self, op: Operator, target: Subgraph, tensor_of) -> Operator:
        options = dict(op.options)
        fields = ops.subgraph_fields(op)
        if fields:
            subgraphs = self.source.subgraphs
            for name in fields:
                index = options[name]
                if isinstance(index, int):
                    options[name] = self.renumber[id(subgraphs[index])]
                else:
                    options[name] = [self.renumber[id(subgraphs[k])] for k in index]
        new = Operator(op.op_type, version=op.version, options=options, custom_code=op.custom_code,
                       custom_options=op.custom_options)
        new.custom_options_format = op.custom_options_format
        new.options_table = op.options_table
        target.add_operator(new, [None if t is None else tensor_of(t) for t in op.inputs],
                            [None if t is None else tensor_of(t) for t in op.outputs])
        new.intermediates = [tensor_of(t) for t in op.intermediates]
        return new

    def whole_subgraph(self, sg: Subgraph) -> None:
        target = self.model.add_subgraph(sg.name)
        copies: dict[int, Tensor] = {}
        for t in sg.tensors:
            copies[id(t)] = target.add_tensor(t.detached())

        def tensor_of(t: Tensor) -> Tensor:
            if id(t) not in copies:  # a tensor an operator uses but the list lacks
                copies[id(t)] = target.add_tensor(t.detached())
            return copies[id(t)]

        for op in sg.operators:
            self.operator(op, target, tensor_of)
        target.inputs = [tensor_of(t) for t in sg.inputs]
        target.outputs = [tensor_of(t) for t in sg.outputs]


def partition_model(nodes: Sequence[Operator], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> PartitionModel:
    """The model that runs ``nodes`` (consecutive operators of one subgraph) on ``inputs``
    and returns ``outputs`` (a partition's tensors, as the interpreter computed them)."""
    callees = reachable_subgraphs(nodes)
    copier = _Copier(nodes[0].subgraph.model, callees)
    main = copier.main
    copies: dict[int, Tensor] = {}

    def tensor_of(t: Tensor) -> Tensor:
        if id(t) not in copies:
            copies[id(t)] = main.add_tensor(t.detached())
        return copies[id(t)]

    for t in inputs:  # first, so the model's tensor order starts with what it reads
        tensor_of(t)
    for op in nodes:
        copier.operator(op, main, tensor_of)
    variable_inputs = [k for k, t in enumerate(inputs) if t.is_variable]
    main.inputs = [copies[id(t)] for t in inputs if not t.is_variable]
    main.outputs = [copies[id(t)] for t in outputs if not t.is_variable]
    for sg in callees:
        copier.whole_subgraph(sg)
    index = {id(t): i for i, t in enumerate(main.tensors)}
    return PartitionModel(
        model=copier.model,
        inputs=[index[id(copies[id(t)])] for t in inputs if not t.is_variable],
        outputs=[index[id(copies[id(t)])] for t in outputs],
        variable_inputs=variable_inputs,
        variables=[index[id(copies[id(inputs[k])])] for k in variable_inputs],
    )
