"""Resource variables and CALL_ONCE inside XlaDelegate partitions.

The interpreter keeps one store of resource variables (kiln/runtime/variables.py), reached
through the partition's ``runtime``. A partition that reads or writes variables compiles to
a function that takes, besides its inputs, the current values of the variables it reads
before writing them, and returns the values of the variables it writes. The kernel passes
the stored values in and hands the new ones back to the store as device arrays (`hold`), so
a variable only the partition touches never leaves the device; nodes outside the partition
(and signatures) read it through the store, which copies it to NumPy on demand.

VAR_HANDLE gives the interpreter's own resource id (two handles with one shared_name are one
variable); a handle that enters the partition as an input is a static input (its value is
part of the compile key). Which variables a partition reads and writes follows from those
ids, in node order, before tracing. CALL_ONCE is hoisted: the kernel asks the interpreter to
run its init subgraph (once per interpreter, as LiteRT) before running the executable. That
is program order only when no variable op comes before the CALL_ONCE in its subgraph, so
such a CALL_ONCE is left to the reference kernels. An ASSIGN_VARIABLE may change a
variable's shape or type, as the reference kernels allow; the next read then compiles for
the new signature.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import numpy as np

from .. import ops
from ..errors import OpError
from ..schema import DType


def why_not(op) -> str | None:
    """The delegate's own condition on CALL_ONCE (see the module doc), else None."""
    if op.op_type != "CALL_ONCE" or op.subgraph is None:
        return None
    for earlier in op.subgraph.operators:
        if earlier is op:
            return None
        if ops.states(earlier.op_type, "resource") and earlier.op_type not in ("VAR_HANDLE", "CALL_ONCE"):
            return ("CALL_ONCE comes after a READ_VARIABLE / ASSIGN_VARIABLE of its subgraph; the delegate "
                    "runs inits before its partition, which would change their order")
    return None


class Plan:
    """The resource ids a partition reads before writing them (inputs), and those it writes."""

    def __init__(self, reads: Sequence[int], writes: Sequence[int]):
        self.reads = tuple(reads)
        self.writes = tuple(writes)


class _TraceStore:
    """The store lower_vars' lowerings use while a partition traces: reads of variables the
    partition has not written yet come from the function's variable arguments."""

    def __init__(self, runtime, plan: Plan, values: Sequence):
        self.runtime = runtime
        self.inputs = dict(zip(plan.reads, values))
        self.written: dict = {}

    @staticmethod
    def _rid(call, handle) -> int:
        if not isinstance(handle, np.ndarray) or handle.size != 1:
            raise OpError(f"{call.op.name}: the variable handle is not known while compiling")
        return int(handle.reshape(()))

    def handle(self, call) -> np.ndarray:
        opts = call.opts
        return np.array(self.runtime.resource_id(opts.container or "", opts.shared_name or ""), np.int32)

    def read(self, call, handle):
        import jax.numpy as jnp

        rid = self._rid(call, handle)
        if rid in self.written:
            return self.written[rid]
        if rid not in self.inputs:
            raise OpError(f"{call.op.name}: resource {rid} is not among the partition's variables")
        return jnp.asarray(self.inputs[rid])

    def assign(self, call, handle, value) -> None:
        import jax.numpy as jnp

        # As the reference kernel stores the value tensor, in the tensor's type (not the
        # bfloat16 policy's compute type).
        want = call.op.inputs[1].dtype.numpy
        value = jnp.asarray(value)
        self.written[self._rid(call, handle)] = value if value.dtype == want else value.astype(want)

    def call_once(self, call) -> None:
        return None  # the kernel ran the init before the executable (PartitionVariables.before)


class PartitionVariables:
    """What one partition does with resource variables; None from `of` when nothing."""

    def __init__(self, partition, nodes, label: str):
        runtime = partition.runtime
        if runtime is None or not hasattr(runtime, "variables"):
            raise OpError(f"{label}: the partition has resource-variable ops but the interpreter gave the "
                          "delegate no runtime to reach its variables")
        self.runtime = runtime
        self.label = label
        self.nodes = list(nodes)
        self.inits = [int(n.call.opts.init_subgraph_index) for n in nodes if n.op.op_type == "CALL_ONCE"]
        self.handle_inputs = [k for k, t in enumerate(partition.inputs) if t.dtype == DType.RESOURCE]
        self.inputs = partition.inputs
        self._plans: dict[tuple, Plan] = {}

    @classmethod
    def of(cls, partition, nodes, label: str) -> "PartitionVariables | None":
        if any(ops.states(n.op.op_type, "resource") for n in nodes) or \
                any(t.dtype == DType.RESOURCE for t in partition.inputs):
            return cls(partition, nodes, label)
        return None

    def plan(self, inputs: Sequence) -> Plan:
        """The variables read and written for these handle input values (usually none)."""
        key = tuple(int(np.asarray(inputs[k]).reshape(())) for k in self.handle_inputs)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(dict(zip(self.handle_inputs, key)))
        return plan

    def _make_plan(self, handle_values: dict[int, int]) -> Plan:
        handles = {id(self.inputs[k]): rid for k, rid in handle_values.items()}
        reads, writes = [], []
        for n in self.nodes:
            op = n.op
            if op.op_type == "VAR_HANDLE":
                opts = n.call.opts
                handles[id(op.outputs[0])] = self.runtime.resource_id(opts.container or "", opts.shared_name or "")
            elif op.op_type in ("READ_VARIABLE", "ASSIGN_VARIABLE"):
                rid = handles.get(id(op.inputs[0]))
                if rid is None:
                    raise OpError(f"{self.label}: {op.name} uses a handle the partition cannot resolve")
                if op.op_type == "ASSIGN_VARIABLE":
                    if rid not in writes:
                        writes.append(rid)
                elif rid not in writes and rid not in reads:
                    reads.append(rid)
        return Plan(reads, writes)

    def before(self) -> None:
        """Run the CALL_ONCE inits of the partition this interpreter has not run yet."""
        for index in self.inits:
            self.runtime.call_once(index)

    def values(self, plan: Plan) -> list:
        """The stored values of the variables the partition reads (device arrays stay there)."""
        store, out = self.runtime.variables, []
        for rid in plan.reads:
            value = store.held(rid)
            if value is None:
                raise OpError(f"{self.label}: READ_VARIABLE of resource {rid} before any ASSIGN_VARIABLE "
                              "initialised it")
            out.append(value)
        return out

    @staticmethod
    def key(values: Sequence) -> tuple:
        return tuple((tuple(v.shape), np.dtype(v.dtype).str) for v in values)

    @contextmanager
    def tracing(self, plan: Plan, values: Sequence):
        """Trace the partition's nodes with variable reads and writes going through ``plan``."""
        from .lower_vars import using  # imports JAX: kiln.xla itself must import without it

        store = _TraceStore(self.runtime, plan, values)
        with using(store):
            yield store

    @staticmethod
    def written(store: _TraceStore, plan: Plan) -> list:
        return [store.written[rid] for rid in plan.writes]

    def after(self, plan: Plan, new_values: Sequence) -> None:
        """Hand the written variables to the interpreter's store, as device arrays."""
        store = self.runtime.variables
        for rid, value in zip(plan.writes, new_values):
            store.hold(rid, value)
