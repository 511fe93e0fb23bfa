"""The IR's invariants, checked on a whole model (after every pass when asked).

The mutators in graph.py keep these true; this check finds the code that went around them.
"""

from __future__ import annotations

from .graph import IRError, Model


def check_invariants(model: Model) -> None:
    """Raise IRError, naming the place, when use-def links, membership, operator order,
    subgraph ends or signatures disagree."""
    for si, sg in enumerate(model.subgraphs):
        where = f"subgraph {si}"
        if sg.model is not model:
            raise IRError(f"{where} {sg.name!r} is not linked to its model")
        tensor_ids = set()
        for t in sg.tensors:
            if t.subgraph is not sg:
                raise IRError(f"{where}: tensor {t.name!r} is listed but belongs to another subgraph")
            if id(t) in tensor_ids:
                raise IRError(f"{where}: tensor {t.name!r} is listed twice")
            tensor_ids.add(id(t))
        defined = {id(t) for t in sg.tensors if t.producer is None}
        seen_ops: set[int] = set()
        for oi, op in enumerate(sg.operators):
            at = f"{where} op {oi} {op.name}"
            if op.subgraph is not sg:
                raise IRError(f"{at}: operator not linked to its subgraph")
            if id(op) in seen_ops:
                raise IRError(f"{at}: operator listed twice")
            seen_ops.add(id(op))
            for i, t in enumerate(op.inputs):
                if t is None:
                    continue
                if id(t) not in tensor_ids:
                    raise IRError(f"{at}: input {t.name!r} not in subgraph")
                if (op, i) not in t.users:
                    raise IRError(f"{at}: input {t.name!r} lacks use link")
                if id(t) not in defined:
                    raise IRError(f"{at}: input {t.name!r} used before it is produced")
            for t in op.outputs:
                if t is None:
                    continue
                if t.producer is not op:
                    raise IRError(f"{at}: output {t.name!r} has another producer")
                if id(t) not in tensor_ids:
                    raise IRError(f"{at}: output {t.name!r} not in subgraph")
                defined.add(id(t))
        for t in list(sg.inputs) + list(sg.outputs):
            if id(t) not in tensor_ids:
                raise IRError(f"{where}: input/output tensor {t.name!r} not in subgraph")
        for t in sg.tensors:
            for op, i in t.users:
                if op.subgraph is not sg or op.inputs[i] is not t:
                    raise IRError(f"{where}: tensor {t.name!r} has a stale use by {op.name}")
            if t.producer is not None and (t.producer.subgraph is not sg or t not in t.producer.outputs):
                raise IRError(f"{where}: tensor {t.name!r} has a stale producer {t.producer.name}")
    _check_signatures(model)


def _check_signatures(model: Model) -> None:
    for sig in model.signatures:
        at = f"signature {sig.key!r}"
        if not any(sg is sig.subgraph for sg in model.subgraphs):
            raise IRError(f"{at}: its subgraph {sig.subgraph.name!r} is not part of the model")
        ends = (("input", sig.inputs, sig.subgraph.inputs), ("output", sig.outputs, sig.subgraph.outputs))
        for kind, named, tensors in ends:
            for key, t in named.items():
                if not any(t is s for s in tensors):
                    raise IRError(f"{at}: {kind} {key!r} is tensor {t.name!r}, not an {kind} of its subgraph")
