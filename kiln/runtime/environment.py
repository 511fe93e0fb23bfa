"""Where a subgraph runs: its execution plan, its values, and the kernels' view of the
interpreter.

A `_SubgraphEnv` keeps one subgraph's values keyed by tensor index and its plan of steps
(nodes, or delegated partitions). Intermediate values are dropped right after their last
use (unless ``experimental_preserve_all_tensors``), so peak memory follows the live set,
not the tensor count. `_Runtime` is what kernels may ask of the interpreter: running
another subgraph (control flow) and resource variables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import KilnError, ModelError, OpError, RegistrationError
from ..ir import Operator, Tensor
from ..ops.record import KernelCall
from ..schema import DType
from .custom import Context, Node, TensorView, decode_builtin_options
from .delegate import Delegate, NodeInfo, NodesRefused, Partition
from .node_errors import in_node
from .resolver import Registration
from .variables import ResourceVariables

if TYPE_CHECKING:  # pragma: no cover
    from .interpreter import Interpreter


#: Refuse single tensors larger than this many bytes (hostile shapes; override if needed).
MAX_TENSOR_BYTES = 1 << 34


def reset_value(t: Tensor) -> np.ndarray:
    """A variable tensor's value before anything writes it, as LiteRT's ResetVariableTensor
    sets it: zeros, except an int8 variable, which starts at its zero point (0.0)."""
    q = t.quantization
    if t.dtype == DType.INT8 and q is not None and q.zero_point.size:
        return np.full(t.shape, q.zero_point[0], dtype=np.int8)
    return np.zeros(t.shape, dtype=t.dtype.numpy)


def _runs_once(op: Operator) -> bool:
    """A DEQUANTIZE of a constant into a variable tensor. LiteRT dequantizes a constant once
    and keeps the output (dequantize.cc: a persistent tensor, evaluated on the first invoke
    only), so a variable written that way — the LSTM state TF's float16 conversion starts from
    float16 zeros — carries the state between invokes like any variable tensor, and only
    `reset_all_variables` zeroes it. Run on every invoke it would reset the state each time."""
    return op.op_type == "DEQUANTIZE" and bool(op.inputs) and op.inputs[0] is not None and \
        op.inputs[0].is_constant and any(t is not None and t.is_variable for t in op.outputs)


@dataclass
class _Step:
    """One entry of the execution plan: a node, or a delegated partition of nodes."""

    index: int
    label: str
    ins: list[int]
    outs: list[int]
    reg: Registration | None = None
    call: KernelCall | None = None
    node: Node | None = None
    delegate_kernel: object = None
    prepared_shapes: tuple | None = None
    free_after: list[int] = field(default_factory=list)
    op_names: tuple[str, ...] = ()   # one per node (a delegated partition has several)
    delegate: str | None = None      # name of the delegate running the step
    claimer: Delegate | None = None  # the delegate itself
    output_name: str | None = None   # a node's first output, named in its errors
    # Run-loop shortcuts, filled in by prepare():
    kernel: object = None            # the kernel chosen for the node's operand types
    dense_ins: bool = False          # no omitted (-1) operand among ins
    plain_out: int | None = None     # the one output tensor, when a bare array can go straight in
    plain_dtype: np.dtype | None = None
    state_ins: tuple[int, ...] = ()  # tensors of the record's state_operands, written after the node
    exact: bool = False              # a delegate kernel whose results are stored as they are


@dataclass(frozen=True)
class ProfileEvent:
    """One executed plan step, as `Interpreter.profiler` receives it.

    A step is one node, or a whole partition claimed by a delegate (``delegate`` names it,
    ``op_names`` lists its nodes). Steps of control-flow bodies arrive with their own
    ``subgraph``; their time is also inside the calling WHILE / IF step.
    """

    subgraph: int
    node: int
    op_names: tuple[str, ...]
    seconds: float
    delegate: str | None = None


class _SubgraphEnv:
    """Values, shapes and the execution plan of one subgraph."""

    def __init__(self, interp: "Interpreter", index: int):
        self.interp = interp
        self.sg_index = index
        self.sg = interp._model.subgraphs[index]
        self.tensors: list[Tensor] = self.sg.tensors
        self.pos = {id(t): i for i, t in enumerate(self.tensors)}
        self.values: list[np.ndarray | None] = [None] * len(self.tensors)
        self.shapes: list[tuple[int, ...]] = [t.shape for t in self.tensors]
        self.inputs = [self.pos[id(t)] for t in self.sg.inputs]
        self.outputs = [self.pos[id(t)] for t in self.sg.outputs]
        self.steps: list[_Step] | None = None
        #: Steps LiteRT runs once, before the first invoke's others (`_runs_once`); emptied then.
        self.once_steps: list[_Step] = []
        self.shapes_stale = False  # an input was resized since the last run
        self._kept: set[int] | None = None  # tensors the plan never frees (see _plan_frees)
        self.num_threads = interp._num_threads or 1
        self.context = Context(self)
        self._init_values()

    # -- values ------------------------------------------------------------------------------
    def _init_values(self) -> None:
        inputs = set(self.inputs)
        for i, t in enumerate(self.tensors):
            if t.is_variable:
                self.values[i] = self._initial_variable(t)
            elif t.data is not None:
                self.values[i] = t.data
            elif t.producer is None and i not in inputs and 0 in t.shape:
                # An empty constant has no bytes, so the file stores no buffer for it.
                self.values[i] = np.zeros(t.shape, dtype=t.dtype.numpy)

    def _initial_variable(self, t: Tensor) -> np.ndarray:
        if t.data is not None:
            return np.array(t.data, dtype=t.dtype.numpy, copy=True).reshape(t.shape)
        self.check_allocation(self.pos[id(t)], t.shape, t.dtype.numpy)
        return reset_value(t)

    def reset_variables(self) -> None:
        for i, t in enumerate(self.tensors):
            if t.is_variable:
                self.values[i] = self._initial_variable(t)

    def check_allocation(self, index: int, shape, dtype) -> None:
        nbytes = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
        if nbytes > MAX_TENSOR_BYTES:
            raise ModelError(
                f"subgraph {self.sg_index}, tensor {index} ({self.tensors[index].name!r}): shape "
                f"{list(shape)} needs {nbytes} bytes, more than kiln allows for one tensor "
                f"(kiln.runtime.environment.MAX_TENSOR_BYTES = {MAX_TENSOR_BYTES})")

    def allocate_inputs(self) -> None:
        for i in self.inputs:
            t = self.tensors[i]
            if t.is_variable or t.data is not None:
                continue
            cur = self.values[i]
            if cur is None or cur.shape != self.shapes[i]:
                self.check_allocation(i, self.shapes[i], t.dtype.numpy)
                self.values[i] = np.zeros(self.shapes[i], dtype=t.dtype.numpy)

    # -- planning ----------------------------------------------------------------------------
    def prepare(self) -> None:
        if self.steps is not None:
            return
        interp = self.interp
        ops = self.sg.operators
        self._check_dataflow(ops)
        regs = [self._resolve(oi, op) for oi, op in enumerate(ops)]
        once = {oi for oi, op in enumerate(ops) if _runs_once(op)}
        claimed: list[Delegate | None] = [None] * len(ops)
        for delegate in interp._delegates:
            for oi, op in enumerate(ops):
                if claimed[oi] is None and oi not in once and \
                        delegate.claims(NodeInfo(oi, op, op.name, op.version, regs[oi])):
                    claimed[oi] = delegate
            self._review(delegate, claimed, regs)
        steps: list[_Step] = []
        self.once_steps = [self._node_step(oi, ops[oi], regs[oi]) for oi in sorted(once)]
        for first, last in _runs(claimed):
            if claimed[first] is not None:
                steps.append(self._delegate_step(claimed[first], first, last, regs))
            else:
                steps.extend(self._node_step(oi, ops[oi], regs[oi]) for oi in range(first, last + 1) if oi not in once)
        self._plan_frees(steps)
        for step in (*self.once_steps, *steps):
            self._shortcuts(step)
        self.steps = steps

    def _shortcuts(self, step: _Step) -> None:
        """Precompute what the run loop would otherwise work out per step and invoke."""
        step.dense_ins = all(i >= 0 for i in step.ins)
        step.exact = bool(getattr(step.delegate_kernel, "exact_outputs", False)) and all(i >= 0 for i in step.outs)
        if step.call is None:
            return
        record = step.reg.record
        if record is not None and record.state_operands:
            step.state_ins = tuple(step.ins[k] if k < len(step.ins) else -1 for k in record.state_operands)
            return
        if len(step.outs) == 1 and step.outs[0] >= 0:
            t = self.tensors[step.outs[0]]
            if t.dtype not in (DType.STRING, DType.VARIANT):
                step.plain_out = step.outs[0]
                step.plain_dtype = np.dtype(t.dtype.numpy)

    def _resolve(self, oi: int, op: Operator) -> Registration:
        resolver = self.interp._resolver
        if op.op_type == "CUSTOM":
            reg = resolver.find_custom(op.custom_code, op.version)
            if reg is None:
                ranges = resolver.registered_custom_versions(op.custom_code)
                if ranges:  # registered, but not for this version
                    supported = ", ".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in ranges)
                    raise RegistrationError(
                        f"Didn't find custom operator for name '{op.custom_code}' version '{op.version}' "
                        f"(node {oi}; registered versions: {supported})\nRegistration failed.")
                raise RegistrationError(
                    f"Didn't find custom operator for name '{op.custom_code}'\n"
                    f"Encountered unresolved custom op: {op.custom_code}.\n"
                    f"Node number {oi} ({op.custom_code}) failed to prepare.\nRegistration failed.")
            return reg
        reg = resolver.find_op(op.op_type, op.version)
        if reg is None:
            ranges = resolver.registered_versions(op.op_type)
            supported = ", ".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in ranges) or "none"
            raise RegistrationError(
                f"Didn't find op for builtin opcode '{op.op_type}' version '{op.version}'. "
                "An older version of this builtin might be supported. Are you using an old TFLite "
                f"binary with a newer model? (kiln supports {op.op_type} versions: {supported})\n"
                f"Registration failed.")
        return reg

    def _node_step(self, oi: int, op: Operator, reg: Registration) -> _Step:
        ins = [-1 if t is None else self.pos[id(t)] for t in op.inputs]
        outs = [-1 if t is None else self.pos[id(t)] for t in op.outputs]
        step = _Step(oi, f"node {oi} ({op.name})", ins, outs, reg=reg, op_names=(op.name,),
                     output_name=next((t.name for t in op.outputs if t is not None), None))
        if reg.kernel is not None:
            step.kernel = reg.kernel
            if reg.record is not None and reg.kernel is reg.record.kernel:
                # the record's own kernels: it picks the one for the node's operand types
                try:
                    step.kernel = reg.record.kernel_for(op)
                except KilnError as exc:
                    raise in_node(exc, f"subgraph {self.sg_index}, {step.label}") from None
            opts = reg.record.make_options(op.options) if reg.record is not None else decode_builtin_options(op)
            out_dtypes = [np.dtype(t.dtype.numpy) if t is not None else None for t in op.outputs]
            step.call = KernelCall(opts, op, out_dtypes, runtime=self.interp._runtime)
        else:
            views_in = [None if i < 0 else TensorView(self, i, self.tensors[i]) for i in ins]
            views_out = [None if i < 0 else TensorView(self, i, self.tensors[i], output=True) for i in outs]
            step.node = Node(views_in, views_out, decode_builtin_options(op) if op.op_type != "CUSTOM" else None,
                             op.custom_options, oi, op.name)
            if reg.init is not None:
                step.node.user_data = self._guard(step, reg.init, self.context, op.custom_options or b"")
        return step

    def _review(self, delegate: Delegate, claimed: list, regs) -> None:
        """Let ``delegate`` give back nodes once it sees its claims grouped (`Delegate.review`),
        until it keeps every partition it is shown."""
        for _ in range(len(claimed) + 1):  # each round gives back at least one node
            runs = [(first, last) for first, last in _runs(claimed) if claimed[first] is delegate]
            if not runs:
                return
            try:
                given = set(delegate.review([self._partition(first, last, regs) for first, last in runs]))
            except KilnError:
                raise
            except Exception as exc:
                raise OpError(f"subgraph {self.sg_index}: delegate {delegate.name} failed to review its "
                              f"partitions: {exc}") from exc
            given = {oi for oi in given if 0 <= oi < len(claimed) and claimed[oi] is delegate}
            if not given:
                return
            for oi in given:
                claimed[oi] = None

    def _partition(self, first: int, last: int, regs) -> Partition:
        """Nodes first..last as one partition: what they read from outside and what is read
        of them afterwards."""
        ops = self.sg.operators[first:last + 1]
        produced = {id(t) for op in ops for t in op.outputs if t is not None}
        inputs, seen = [], set()
        for op in ops:
            for t in op.inputs:
                if t is not None and id(t) not in produced and not t.is_constant and id(t) not in seen:
                    seen.add(id(t))
                    inputs.append(t)
        later_reads = {id(t) for op in self.sg.operators[last + 1:] for t in op.inputs if t is not None}
        later_reads |= {id(t) for t in self.sg.outputs}
        # A variable tensor written inside (an LSTM state a FILL starts) is an output too: its
        # final value stays in the interpreter's buffer for get_tensor, as LiteRT leaves it.
        outputs = [t for op in ops for t in op.outputs
                   if t is not None and (id(t) in later_reads or t.is_variable)]
        nodes = [NodeInfo(first + k, op, op.name, op.version, regs[first + k]) for k, op in enumerate(ops)]
        position = {id(t): k for k, t in enumerate(inputs)}
        state_inputs = []
        for op, reg in zip(ops, regs[first:last + 1]):
            for k in (reg.record.state_operands if reg.record is not None else ()):
                t = op.inputs[k] if k < len(op.inputs) else None
                if t is not None and id(t) in position and position[id(t)] not in state_inputs:
                    state_inputs.append(position[id(t)])
        return Partition(nodes, inputs, outputs, state_inputs, runtime=self.interp._runtime,
                         num_threads=self.interp._num_threads)

    def _delegate_step(self, delegate: Delegate, first: int, last: int, regs) -> _Step:
        partition = self._partition(first, last, regs)
        ops = [node.op for node in partition.nodes]
        label = f"nodes {first}..{last} (delegated to {delegate.name})"
        step = _Step(first, label, [self.pos[id(t)] for t in partition.inputs],
                     [self.pos[id(t)] for t in partition.outputs],
                     op_names=tuple(op.name for op in ops), delegate=delegate.name, claimer=delegate)
        step.state_ins = tuple(step.ins[k] for k in partition.state_inputs)
        try:
            step.delegate_kernel = delegate.prepare(partition)
        except KilnError:
            raise
        except Exception as exc:  # a delegate's own failure, reported with where it happened
            raise OpError(f"subgraph {self.sg_index}, {label}: delegate failed to prepare: {exc}") from exc
        return step

    def delegated_step_producing(self, index: int) -> _Step | None:
        """The delegated plan step whose nodes write tensor ``index`` (None if none does)."""
        producer = self.tensors[index].producer
        if producer is None or self.steps is None:
            return None
        for step in self.steps:
            if step.delegate is not None and any(
                    op is producer for op in self.sg.operators[step.index:step.index + len(step.op_names)]):
                return step
        return None

    def _check_dataflow(self, ops) -> None:
        """Every operator reads only tensors written before it, and every output is written —
        checked per node, before delegates merge nodes into partitions that would hide the order."""
        ready = set(self.inputs)
        ready.update(i for i, v in enumerate(self.values) if v is not None)
        for oi, op in enumerate(ops):
            for t in op.inputs:
                if t is not None and self.pos[id(t)] not in ready:
                    raise ModelError(f"subgraph {self.sg_index}, node {oi} ({op.name}): reads tensor "
                                     f"{self.pos[id(t)]} ({t.name!r}) before any operator writes it")
            ready.update(self.pos[id(t)] for t in op.outputs if t is not None)
        for i in self.outputs:
            if i not in ready:
                raise ModelError(f"subgraph {self.sg_index}: output tensor {i} ({self.tensors[i].name!r}) "
                                 "is never written")

    def _plan_frees(self, steps: list[_Step]) -> None:
        if self.interp._preserve_all:
            return
        if self._kept is None:  # what holds a value before the first run: never freed
            self._kept = set(self.inputs) | set(self.outputs)
            self._kept.update(i for i, v in enumerate(self.values) if v is not None)
        keep = self._kept
        for step in steps:
            step.free_after = []
        last_use: dict[int, int] = {}
        for si, step in enumerate(steps):
            for i in (*step.ins, *step.outs):
                if i >= 0 and i not in keep:
                    last_use[i] = si
        for i, si in last_use.items():
            steps[si].free_after.append(i)

    # -- execution ---------------------------------------------------------------------------
    def _guard(self, step: _Step, fn, *args):
        """Call a Python custom op's init / prepare / invoke, naming the node on failure."""
        try:
            return fn(*args)
        except RegistrationError:
            raise
        except Exception as exc:
            raise in_node(exc, self._executing(step), user_code=True)

    def _wrapped(self, step: _Step, exc: Exception) -> Exception:
        """The error a kernel's or delegate's failure inside ``step`` is raised as."""
        return in_node(exc, self._executing(step))

    def _executing(self, step: _Step) -> str:
        """Where a failure happened: "subgraph 0, while executing node 12 (MyOp) 'y'"."""
        name = "" if step.output_name is None else f" {step.output_name!r}"
        return f"subgraph {self.sg_index}, while executing {step.label}{name}"

    def run(self, start: int = 0) -> None:
        """Execute the plan once (from step ``start``).

        The loop is the interpreter's hot path, so per step it does no more than gather the
        arguments, call the kernel inside a (zero-cost) try block and store a result whose
        dtype already matches without going through `_store`.
        """
        if self.steps is None:
            self.prepare()
        values = self.values
        shapes = self.shapes
        profiler = self.interp.profiler
        steps = self.steps if not start else self.steps[start:]
        if self.once_steps:
            steps, self.once_steps = [*self.once_steps, *steps], []
        for step in steps:
            if profiler is not None:
                start = time.perf_counter()
            call = step.call
            if call is not None:
                ins = step.ins
                args = [values[i] for i in ins] if step.dense_ins else \
                    [values[i] if i >= 0 else None for i in ins]
                try:
                    result = step.kernel(call, *args)
                except RegistrationError:
                    raise
                except Exception as exc:
                    raise self._wrapped(step, exc)
                if type(result) is np.ndarray and step.plain_out is not None \
                        and (result.dtype is step.plain_dtype or result.dtype == step.plain_dtype):
                    i = step.plain_out
                    values[i] = result
                    shapes[i] = result.shape
                elif step.state_ins:
                    self._store_with_state(step, result)
                else:
                    if not isinstance(result, (tuple, list)):
                        result = (result,)
                    self._store(step, step.outs, result)
            elif step.node is not None:
                self._run_custom(step)
            else:
                try:
                    result = step.delegate_kernel.invoke([values[i] for i in step.ins])
                except NodesRefused as refusal:
                    self.run(self._split(step, refusal))
                    return
                except RegistrationError:
                    raise
                except Exception as exc:
                    raise self._wrapped(step, exc)
                if step.state_ins and len(result) > len(step.outs):
                    self._store_with_state(step, result)
                elif step.exact and len(result) == len(step.outs):
                    for i, value in zip(step.outs, result):
                        values[i] = value
                        shapes[i] = value.shape
                else:
                    self._store(step, step.outs, result)
            if profiler is not None:
                profiler(ProfileEvent(self.sg_index, step.index, step.op_names, time.perf_counter() - start,
                                      step.delegate))
            for i in step.free_after:
                values[i] = None

    def _split(self, step: _Step, refusal: NodesRefused) -> int:
        """Re-plan a delegated step whose kernel refused nodes while running: those run on
        their kernels, the rest goes back to the same delegate. Returns the position of the
        first new step."""
        first, last = step.index, step.index + len(step.op_names) - 1
        refused = {oi for oi in refusal.nodes if first <= oi <= last}
        if not refused:
            raise OpError(f"subgraph {self.sg_index}, {step.label}: the delegate refused nodes "
                          f"{sorted(refusal.nodes)}, which are not its own ({refusal.reason})")
        ops = self.sg.operators
        regs = [self._resolve(oi, op) if first <= oi <= last else None for oi, op in enumerate(ops)]
        claimed = [step.claimer if oi not in refused else None for oi in range(first, last + 1)]
        new_steps: list[_Step] = []
        for a, b in _runs(claimed):
            if claimed[a] is not None:
                new_steps.append(self._delegate_step(step.claimer, first + a, first + b, regs))
            else:
                new_steps.extend(self._node_step(oi, ops[oi], regs[oi]) for oi in range(first + a, first + b + 1))
        position = self.steps.index(step)
        self.steps[position:position + 1] = new_steps
        self._plan_frees(self.steps)
        for new in new_steps:
            self._shortcuts(new)
        return position

    def refresh_shapes(self) -> None:
        """After an input resize, learn every tensor's new shape, as LiteRT's Prepare does.

        kiln's kernels compute shapes while they run, so this runs the subgraph once on the
        current inputs and then restores every value and variable it touched. Subgraphs with
        Python custom ops, loops or delegated state the interpreter cannot restore are left
        alone (a run could have side effects or be long); their shapes update on the first
        invoke.
        """
        if any(s.node is not None or "WHILE" in s.op_names or getattr(s.delegate_kernel, "hidden_state", False)
               for s in self.steps):
            return
        interp = self.interp
        saved = {k: list(env.values) for k, env in interp._envs.items()}
        saved_once_steps = {k: list(env.once_steps) for k, env in interp._envs.items()}
        rt = interp._runtime
        saved_vars, saved_once = rt.variables.snapshot(), set(rt.call_once_done)
        try:
            self.run()
        except KilnError:
            pass  # the real invoke will report it, with the user's data
        finally:
            for k, values in saved.items():
                interp._envs[k].values[:] = values
                interp._envs[k].once_steps = saved_once_steps[k]
            rt.variables.restore(saved_vars)
            rt.call_once_done.clear()
            rt.call_once_done.update(saved_once)
        # An output the last invoke left is of the old shape: drop it, so its details (and
        # get_tensor, zeros until the next invoke) follow the new shape, as LiteRT's do.
        for i in self.outputs:
            value = self.values[i]
            if value is not None and i not in self.inputs and not self.tensors[i].is_variable \
                    and self.tensors[i].data is None and value.shape != self.shapes[i]:
                self.values[i] = None
        self.shapes_stale = False

    def _store(self, step: _Step, outs: Sequence[int], result) -> None:
        if len(result) < len(outs) and len(result) < sum(1 for i in outs if i >= 0):
            raise OpError(f"subgraph {self.sg_index}, {step.label}: kernel returned {len(result)} "
                          f"values for {len(outs)} outputs")
        values, shapes, tensors = self.values, self.shapes, self.tensors
        for i, value in zip(outs, result):
            if i < 0 or value is None:
                continue
            t = tensors[i]
            dtype = t.dtype.numpy
            arr = value if type(value) is np.ndarray else np.asarray(value)
            if arr.dtype != dtype and t.dtype not in (DType.STRING, DType.VARIANT):
                arr = arr.astype(dtype)
            values[i] = arr
            shapes[i] = arr.shape

    def _store_with_state(self, step: _Step, result) -> None:
        """Store a stateful kernel's outputs, then write its new state values (the results
        after the outputs) into the tensors of the record's ``state_operands``."""
        n = len(step.outs)
        if not isinstance(result, (tuple, list)) or len(result) != n + len(step.state_ins):
            got = len(result) if isinstance(result, (tuple, list)) else 1
            raise OpError(f"subgraph {self.sg_index}, {step.label}: a kernel with state operands returns "
                          f"{n} outputs and {len(step.state_ins)} states, got {got} values")
        self._store(step, step.outs, result[:n])
        for i, value in zip(step.state_ins, result[n:]):
            if i >= 0 and value is not None:
                self.values[i] = np.asarray(value, dtype=self.tensors[i].dtype.numpy)

    def _run_custom(self, step: _Step) -> None:
        reg, node = step.reg, step.node
        in_shapes = tuple(self.values[i].shape if i >= 0 and self.values[i] is not None else None
                          for i in step.ins)
        if in_shapes != step.prepared_shapes:
            for i in step.outs:
                if i >= 0:
                    t = self.tensors[i]
                    self.check_allocation(i, self.shapes[i], t.dtype.numpy)
                    self.values[i] = np.zeros(self.shapes[i], dtype=t.dtype.numpy)
            if reg.prepare is not None:
                self._guard(step, reg.prepare, self.context, node)
            step.prepared_shapes = in_shapes
        else:
            for i in step.outs:  # fresh output buffers (earlier results may still be referenced),
                if i >= 0:       # made when the op first reads them (TensorView.data)
                    self.values[i] = None
        if reg.invoke is None:
            raise OpError(f"subgraph {self.sg_index}, {step.label}: the registration has no invoke")
        self._guard(step, reg.invoke, self.context, node)
        for i in step.outs:
            if i >= 0:
                if self.values[i] is None:  # the op left it alone: zeros, as before
                    self.values[i] = np.zeros(self.shapes[i], dtype=self.tensors[i].dtype.numpy)
                self.shapes[i] = self.values[i].shape

    def free_custom_ops(self) -> None:
        for step in self.steps or ():
            if step.node is not None and step.reg.free is not None:
                try:
                    step.reg.free(self.context, step.node.user_data)
                except Exception:  # never let cleanup mask the real error / exit path
                    pass


def _runs(claimed: list) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive nodes with the same claimer (None included)."""
    runs, first = [], 0
    for oi in range(1, len(claimed) + 1):
        if oi == len(claimed) or claimed[oi] is not claimed[first]:
            runs.append((first, oi - 1))
            first = oi
    return runs


class _Runtime:
    """The kernels' view of the interpreter (control flow, resource variables)."""

    def __init__(self, interp: "Interpreter"):
        self._interp = interp
        self.variables = ResourceVariables()
        self.call_once_done: set[int] = set()
        #: id(node) -> (key, counter) of a random op's generator (kiln.ops.random).
        self.random_streams: dict[int, tuple[int, int]] = {}

    def registration(self, op: Operator) -> Registration | None:
        """The registration the interpreter's op resolver gives ``op`` (None: it has none)."""
        resolver = self._interp._resolver
        if op.op_type == "CUSTOM":
            return resolver.find_custom(op.custom_code, op.version)
        return resolver.find_op(op.op_type, op.version)

    def resource_id(self, container: str, shared_name: str) -> int:
        """The id of resource variable (container, shared_name), the same for every subgraph."""
        return self.variables.resource_id(container, shared_name)

    def call_once(self, index: int) -> None:
        """Run init subgraph ``index`` unless this interpreter already has (CALL_ONCE)."""
        if index not in self.call_once_done:
            self.call_once_done.add(index)
            self.call_subgraph(index, [])

    def reset(self) -> None:
        self.variables.clear()
        self.call_once_done.clear()

    def call_subgraph(self, index: int, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        interp = self._interp
        if not 0 <= index < len(interp._model.subgraphs):
            raise OpError(f"subgraph {index} does not exist")
        env = interp._env(index)
        if len(inputs) != len(env.inputs):
            raise OpError(f"subgraph {index} takes {len(env.inputs)} inputs, got {len(inputs)}")
        for i, value in zip(env.inputs, inputs):
            arr = np.asarray(value)
            env.values[i] = arr
            env.shapes[i] = arr.shape
        env.run()
        return [env.values[i] for i in env.outputs]
