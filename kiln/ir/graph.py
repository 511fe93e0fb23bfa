"""kiln's one model representation: tensors with use-def links, operators, subgraphs, model.

The importer writes it, passes rewrite it, the exporter serialises it and the runtime loads
into it. Every edge change goes through a mutator here so that `Tensor.producer` and
`Tensor.users` always agree with the operators' input and output lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..errors import KilnError
from ..schema import DType
from .options import OpOptions
from .quant import QuantParams


class IRError(KilnError):
    """An IR mutation would break the graph's invariants."""


class Tensor:
    """A value in a subgraph: an activation, a constant (``data`` set) or a variable.

    ``shape`` is the static shape as stored in the file (dynamic dims hold 1 or the last seen
    size); ``shape_signature`` keeps -1 for dims that are dynamic (None when fully static).
    """

    __slots__ = (
        "name", "dtype", "shape", "shape_signature", "data", "quantization", "is_variable",
        "producer", "users", "sparsity", "has_rank", "subgraph",
    )

    def __init__(
        self,
        name: str,
        dtype: DType,
        shape: Iterable[int],
        *,
        data: np.ndarray | None = None,
        shape_signature: Iterable[int] | None = None,
        quantization: QuantParams | None = None,
        is_variable: bool = False,
        sparsity=None,
        has_rank: bool = False,
    ):
        self.name = name
        self.dtype = DType(dtype)
        self.shape = tuple(int(d) for d in shape)
        sig = None if shape_signature is None else tuple(int(d) for d in shape_signature)
        self.shape_signature = sig if sig != self.shape else None
        self.data = data
        self.quantization = quantization
        self.is_variable = is_variable
        self.sparsity = sparsity
        self.has_rank = has_rank
        self.producer: Operator | None = None
        self.users: list[tuple[Operator, int]] = []
        self.subgraph: Subgraph | None = None

    # -- queries -----------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return self.data is not None and not self.is_variable

    @property
    def signature(self) -> tuple[int, ...]:
        """Shape with -1 for dynamic dims (the file's shape_signature, else the shape)."""
        return self.shape_signature if self.shape_signature is not None else self.shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def detached(self) -> "Tensor":
        """A tensor like this one (the same data array, not a copy) with no producer or users:
        for a model built from pieces of another (a partition, one op on its own)."""
        return Tensor(self.name, self.dtype, self.shape, data=self.data, shape_signature=self.shape_signature,
                      quantization=self.quantization, is_variable=self.is_variable, sparsity=self.sparsity,
                      has_rank=self.has_rank)

    @property
    def user_ops(self) -> list["Operator"]:
        """Distinct operators that read this tensor, in first-use order."""
        seen: dict[int, Operator] = {}
        for op, _ in self.users:
            seen.setdefault(id(op), op)
        return list(seen.values())

    # -- mutation ----------------------------------------------------------------------------
    def replace_all_uses_with(self, other: "Tensor") -> None:
        """Point every reader of this tensor at ``other`` instead: operators, the subgraph's
        outputs and the signatures that name it as an output."""
        if other is self:
            return
        for op, index in list(self.users):
            op.set_input(index, other)
        if self.subgraph is not None:
            self.subgraph.replace_output(self, other)

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ("var " if self.is_variable else "")
        return f"<Tensor {kind}{self.name!r} {self.dtype.name} {list(self.signature)}>"


class Operator:
    """One node: an op type ("CONV_2D", or "CUSTOM" with ``custom_code``), its version,
    its input/output tensors (None = optional input left out, -1 in the file), options.

    ``options`` holds the builtin options keyed by schema field name (snake_case), checked
    against the op's record (`OpOptions`): an undeclared name raises, a field left out reads
    as its schema default.
    """

    __slots__ = (
        "op_type", "custom_code", "version", "_inputs", "_outputs", "_options", "custom_options",
        "intermediates", "subgraph", "custom_options_format", "options_table",
    )

    def __init__(
        self,
        op_type: str,
        *,
        version: int = 1,
        options: dict | None = None,
        custom_code: str | None = None,
        custom_options: bytes | None = None,
    ):
        self.op_type = op_type
        self.custom_code = custom_code
        self.version = version
        self.options = dict(options or {})
        self.custom_options = custom_options
        self.custom_options_format = 0
        # Options table name for builtins kiln has no record of (kept for faithful round trips).
        self.options_table: str | None = None
        self._inputs: list[Tensor | None] = []
        self._outputs: list[Tensor | None] = []
        self.intermediates: list[Tensor] = []
        self.subgraph: Subgraph | None = None

    @property
    def options(self) -> OpOptions:
        return self._options

    @options.setter
    def options(self, values) -> None:
        self._options = OpOptions(self.op_type, values)

    @property
    def name(self) -> str:
        """What users know the op as: the custom code for custom ops, else the builtin name."""
        return self.custom_code if self.op_type == "CUSTOM" else self.op_type

    @property
    def inputs(self) -> tuple[Tensor | None, ...]:
        return tuple(self._inputs)

    @property
    def outputs(self) -> tuple[Tensor | None, ...]:
        return tuple(self._outputs)

    def set_input(self, index: int, tensor: Tensor | None) -> None:
        old = self._inputs[index]
        if old is not None:
            old.users.remove((self, index))
        self._inputs[index] = tensor
        if tensor is not None:
            tensor.users.append((self, index))

    def set_inputs(self, tensors: Iterable[Tensor | None]) -> None:
        for i, old in enumerate(self._inputs):
            if old is not None:
                old.users.remove((self, i))
        self._inputs = list(tensors)
        for i, t in enumerate(self._inputs):
            if t is not None:
                t.users.append((self, i))

    def set_outputs(self, tensors: Iterable[Tensor | None]) -> None:
        for old in self._outputs:
            if old is not None and old.producer is self:
                old.producer = None
        self._outputs = list(tensors)
        for t in self._outputs:
            if t is not None:
                if t.producer is not None and t.producer is not self:
                    raise IRError(f"tensor {t.name!r} already has a producer ({t.producer.name})")
                t.producer = self

    def _detach(self) -> None:
        self.set_inputs([])
        self.set_outputs([])

    def __repr__(self) -> str:
        ins = ", ".join("-" if t is None else repr(t.name) for t in self._inputs)
        outs = ", ".join("-" if t is None else repr(t.name) for t in self._outputs)
        return f"<Operator {self.name} v{self.version} ({ins}) -> ({outs})>"


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """The operators and tensors a subgraph held when `Subgraph.checkpoint` was called."""

    subgraph: "Subgraph" = field(repr=False)
    operators: tuple[Operator, ...] = field(repr=False)
    tensors: tuple[Tensor, ...] = field(repr=False)


class Subgraph:
    """An ordered list of operators over tensors, with designated inputs and outputs.

    The subgraph is also the authority for its tensor names (`unique_name`) and can undo a
    failed rewrite (`checkpoint` / `rollback`), so builders never edit its lists directly.
    """

    def __init__(self, name: str = ""):
        self.name = name
        self.tensors: list[Tensor] = []
        self.operators: list[Operator] = []
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.model: Model | None = None
        # Names in use: those of tensors[:_named] plus names handed out since (see unique_name).
        self._names: set[str] = set()
        self._named = 0

    # -- construction ------------------------------------------------------------------------
    def add_tensor(self, tensor_or_name: Tensor | str, dtype: DType | None = None,
                   shape: Iterable[int] = (), **kwargs) -> Tensor:
        """Add a tensor (an existing Tensor object, or built from name/dtype/shape/kwargs)."""
        if isinstance(tensor_or_name, Tensor):
            tensor = tensor_or_name
        else:
            tensor = Tensor(tensor_or_name, dtype, shape, **kwargs)
        if tensor.subgraph is not None and tensor.subgraph is not self:
            raise IRError(f"tensor {tensor.name!r} already belongs to another subgraph")
        tensor.subgraph = self
        self.tensors.append(tensor)
        return tensor

    def add_constant(self, name: str, value, dtype: DType | None = None, **kwargs) -> Tensor:
        """Add a constant tensor holding ``value`` (converted to the dtype's numpy type)."""
        arr = np.asarray(value)
        dt = DType.from_numpy(arr.dtype) if dtype is None else DType(dtype)
        if dt != DType.STRING:
            arr = np.asarray(arr, dtype=dt.numpy, order="C")  # keeps 0-d scalars 0-d
        return self.add_tensor(name, dt, arr.shape, data=arr, **kwargs)

    def add_operator(
        self,
        op: Operator | str,
        inputs: Iterable[Tensor | None],
        outputs: Iterable[Tensor | None],
        *,
        index: int | None = None,
        **kwargs,
    ) -> Operator:
        """Append (or insert at ``index``) an operator and link its edges both ways.

        Refused, with nothing changed, for an operator already in a subgraph, a tensor of
        another subgraph, or an output that another operator produces.
        """
        if isinstance(op, str):
            op = Operator(op, **kwargs)
        if op.subgraph is not None:
            where = "this" if op.subgraph is self else f"another ({op.subgraph.name!r})"
            raise IRError(f"cannot add {op.name} to subgraph {self.name!r}: it already belongs to {where} subgraph")
        inputs, outputs = list(inputs), list(outputs)
        for t in (*inputs, *outputs):
            if t is not None and t.subgraph is not None and t.subgraph is not self:
                raise IRError(f"cannot add {op.name} to subgraph {self.name!r}: tensor {t.name!r} "
                              f"belongs to subgraph {t.subgraph.name!r}")
        for t in outputs:
            if t is not None and t.producer is not None:
                raise IRError(f"tensor {t.name!r} already has a producer ({t.producer.name})")
        op.subgraph = self
        op.set_inputs(inputs)
        op.set_outputs(outputs)
        if index is None:
            self.operators.append(op)
        else:
            self.operators.insert(index, op)
        return op

    def remove_operator(self, op: Operator) -> None:
        """Remove an operator whose outputs nobody reads any more (refused otherwise)."""
        for t in op.outputs:
            if t is None:
                continue
            if t.users:
                users = ", ".join(u.name for u in t.user_ops)
                raise IRError(f"cannot remove {op.name}: its output {t.name!r} is still used by {users}")
            if t in self.outputs:
                raise IRError(f"cannot remove {op.name}: its output {t.name!r} is a subgraph output")
        op._detach()
        self.operators.remove(op)
        op.subgraph = None

    def remove_unused_tensors(self) -> int:
        """Drop tensors that no operator, input or output references; returns how many."""
        keep_ids = {id(t) for t in self.inputs} | {id(t) for t in self.outputs}
        for op in self.operators:
            keep_ids.update(id(t) for t in op.inputs if t is not None)
            keep_ids.update(id(t) for t in op.outputs if t is not None)
            keep_ids.update(id(t) for t in op.intermediates)
        before = len(self.tensors)
        self.tensors = [t for t in self.tensors if id(t) in keep_ids]
        self._forget_names()
        return before - len(self.tensors)

    def replace_output(self, old: Tensor, new: Tensor) -> None:
        """Make ``new`` the subgraph output ``old`` was, in the signatures' outputs too."""
        self.outputs = [new if t is old else t for t in self.outputs]
        if self.model is None:
            return
        for sig in self.model.signatures:
            if sig.subgraph is self:
                for key, t in sig.outputs.items():
                    if t is old:
                        sig.outputs[key] = new

    def move_operators(self, ops: Iterable[Operator], *, before: Operator) -> None:
        """Move ``ops`` (keeping their order) to just before ``before``.

        Refused, with nothing changed, when a moved operator would then read a tensor before
        it is produced, or one of its readers would run before it.
        """
        moving = list(ops)
        ids = {id(op) for op in moving}
        for op in (*moving, before):
            if op.subgraph is not self:
                raise IRError(f"cannot move {op.name}: it is not in subgraph {self.name!r}")
        if id(before) in ids:
            raise IRError(f"cannot move {before.name} before itself")
        rest = [op for op in self.operators if id(op) not in ids]
        at = next(i for i, op in enumerate(rest) if op is before)
        order = rest[:at] + moving + rest[at:]
        position = {id(op): i for i, op in enumerate(order)}
        for op in moving:
            for t in op.inputs:
                if t is not None and t.producer is not None and position.get(id(t.producer), -1) > position[id(op)]:
                    raise IRError(f"cannot move {op.name} before {before.name}: it reads {t.name!r}, "
                                  f"which {t.producer.name} computes later")
            for t in op.outputs:
                for user in () if t is None else t.user_ops:
                    if position.get(id(user), len(order)) < position[id(op)]:
                        raise IRError(f"cannot move {op.name} before {before.name}: its output "
                                      f"{t.name!r} is read earlier, by {user.name}")
        self.operators = order

    # -- names -------------------------------------------------------------------------------
    def unique_name(self, base: str, separator: str = "") -> str:
        """``base`` itself, or ``base`` + separator + the first free number, reserved at once
        (two calls never return the same name, even before a tensor takes it)."""
        names = self._names_in_use()
        name, i = base, 1
        while name in names:
            name, i = f"{base}{separator}{i}", i + 1
        names.add(name)
        return name

    def _names_in_use(self) -> set[str]:
        # Tensors are appended, so only the new tail needs adding; a shorter list means
        # tensors were dropped behind our back: start over from the tensors there are.
        n = len(self.tensors)
        if self._named > n:
            self._forget_names()
        if self._named < n:
            self._names.update(t.name for t in self.tensors[self._named:])
            self._named = n
        return self._names

    def _forget_names(self) -> None:
        self._names = set()
        self._named = 0

    # -- undo --------------------------------------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """A mark to `rollback` to: what the subgraph holds now."""
        return Checkpoint(self, tuple(self.operators), tuple(self.tensors))

    def operators_since(self, checkpoint: Checkpoint) -> list[Operator]:
        """The operators added since ``checkpoint``, in operator order."""
        before = {id(op) for op in checkpoint.operators}
        return [op for op in self.operators if id(op) not in before]

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Take out every operator and tensor added since ``checkpoint``.

        Refused, with nothing changed, when that cannot restore the subgraph: an operator of
        the checkpoint was removed since, or an older operator, a subgraph input/output or a
        signature now uses something added since.
        """
        if checkpoint.subgraph is not self:
            raise IRError(f"checkpoint of subgraph {checkpoint.subgraph.name!r} used on {self.name!r}")
        gone = [op for op in checkpoint.operators if op.subgraph is not self]
        if gone:
            raise IRError(f"cannot roll back subgraph {self.name!r}: {gone[0].name} was removed since the checkpoint")
        added_ops = self.operators_since(checkpoint)
        added_op_ids = {id(op) for op in added_ops}
        kept_tensor_ids = {id(t) for t in checkpoint.tensors}
        added_tensors = [t for t in self.tensors if id(t) not in kept_tensor_ids]
        ends = {id(t) for t in (*self.inputs, *self.outputs, *self._signature_tensors())}
        for t in added_tensors:
            readers = [op for op in t.user_ops if id(op) not in added_op_ids]
            if readers or id(t) in ends:
                who = readers[0].name if readers else "the subgraph's inputs/outputs or a signature"
                raise IRError(f"cannot roll back subgraph {self.name!r}: tensor {t.name!r}, added since "
                              f"the checkpoint, is used by {who}")
        for op in added_ops:
            op._detach()
            op.subgraph = None
        self.operators = [op for op in self.operators if id(op) not in added_op_ids]
        for t in added_tensors:
            t.subgraph = None
        self.tensors = [t for t in self.tensors if id(t) in kept_tensor_ids]
        self._forget_names()

    def _signature_tensors(self) -> list[Tensor]:
        if self.model is None:
            return []
        return [t for sig in self.model.signatures if sig.subgraph is self
                for t in (*sig.inputs.values(), *sig.outputs.values())]

    # -- queries -----------------------------------------------------------------------------
    def tensor_index(self) -> dict[int, int]:
        """id(tensor) -> position in ``tensors`` (recomputed on each call)."""
        return {id(t): i for i, t in enumerate(self.tensors)}

    def topological_order(self) -> list[Operator]:
        """Operators ordered so every producer precedes its users (stable for sorted input)."""
        order: list[Operator] = []
        placed: set[int] = set()
        ready_tensors = {id(t) for t in self.tensors if t.producer is None}
        pending = list(self.operators)
        while pending:
            progress = False
            rest = []
            for op in pending:
                if all(t is None or id(t) in ready_tensors for t in op.inputs):
                    order.append(op)
                    placed.add(id(op))
                    ready_tensors.update(id(t) for t in op.outputs if t is not None)
                    progress = True
                else:
                    rest.append(op)
            if not progress:
                raise IRError(f"subgraph {self.name!r} has a cycle through {rest[0].name}")
            pending = rest
        return order

    def __repr__(self) -> str:
        return f"<Subgraph {self.name!r}: {len(self.operators)} ops, {len(self.tensors)} tensors>"


@dataclass
class Signature:
    """A named entry point: a subgraph plus user-facing names for its inputs and outputs."""

    key: str
    subgraph: Subgraph
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)


class Model:
    """A whole LiteRT model: subgraphs (0 is the main one), signatures, metadata."""

    def __init__(self, description: str = "kiln"):
        self.version = 3
        self.description = description
        self.subgraphs: list[Subgraph] = []
        self.signatures: list[Signature] = []
        self.metadata: dict[str, bytes] = {}
        # Keeps a memory map (or bytes) alive while constant tensors view into it.
        self.backing = None

    def add_subgraph(self, subgraph: Subgraph | str = "") -> Subgraph:
        sg = Subgraph(subgraph) if isinstance(subgraph, str) else subgraph
        sg.model = self
        self.subgraphs.append(sg)
        return sg

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    def subgraph_index(self, subgraph: Subgraph) -> int:
        for i, sg in enumerate(self.subgraphs):
            if sg is subgraph:
                return i
        raise IRError(f"subgraph {subgraph.name!r} is not part of this model")

    def operators(self) -> Iterator[tuple[int, int, Operator]]:
        """(subgraph index, operator index, operator) over the whole model."""
        for si, sg in enumerate(self.subgraphs):
            for oi, op in enumerate(sg.operators):
                yield si, oi, op

    def __repr__(self) -> str:
        return f"<Model {len(self.subgraphs)} subgraphs, {len(self.signatures)} signatures>"
