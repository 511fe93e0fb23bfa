"""XlaDelegate: runs every node that has a lowering through JAX/XLA.

Each partition (a maximal run of claimed nodes) becomes one jitted function. XLA compiles
static shapes, so a partition is compiled once per input signature — the shapes and types of
its run-time inputs plus the values of its static inputs — and the compiled functions live
in a bounded LRU cache. A node that turns out not to lower for the inputs it meets (a loop
whose carried shape changes) is handed back while tracing (NodesRefused): the interpreter
runs it on its reference kernel from then on, and the rest of the partition stays with XLA. Weights are constants of the compiled function, so a call passes only
the partition's run-time inputs.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from ..errors import KilnError, OpError, UnsupportedError
from ..schema import DType
from ..runtime.delegate import DelegateKernel, NodeInfo, Partition, ReportingDelegate
from ._jax import require_jax, x64
from .graph import param_tensors, prepare_nodes, run_nodes, static_tensors, why_not_lowered
from .partition_vars import PartitionVariables
from .partition_vars import why_not as why_not_vars
from .table import lowered_ops

_POLICIES = {None: None, "float32": None, "bfloat16": "bfloat16"}
#: NumPy type codes of the 64-bit types JAX narrows outside its 64-bit mode.
_WIDE = frozenset(np.dtype(t).char for t in (np.int64, np.uint64, np.float64, np.complex128, np.longlong,
                                              np.ulonglong, np.longdouble, np.clongdouble))

#: XLA options for CPU compiles unless the user says otherwise (A/B runs in one process on a
#: shared 2-core machine; bench/xla_bench.py): YNNPACK's dot fusions off, so XLA's own emitters
#: fuse their neighbours (CNN batch 1 1.5x, LSTM-128x2 batch 8 1.8x faster); and XLA
#: single-threaded, as LiteRT's interpreter runs by default: the transformer block runs 1.2-1.6x
#: faster, the CNN and MobileNetV2 at batch 1 alike, MobileNetV2 and the LSTM at batch 8 5-10%
#: slower than on the intra-op pool, using less CPU time. ``{"xla_cpu_multi_thread_eigen":
#: True}`` uses every core. These are per-compile options, not process-wide XLA_FLAGS; an option
#: the user names in XLA_FLAGS is left to it (a compile option would silently override it).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_multi_thread_eigen": False}


def cpu_defaults(xla_flags: str | None = None) -> dict:
    """`CPU_COMPILER_OPTIONS` less those named in XLA_FLAGS (``--name`` or ``--name=value``)."""
    flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    named = {f[2:].split("=", 1)[0] for f in flags.split() if f.startswith("--")}
    return {k: v for k, v in CPU_COMPILER_OPTIONS.items() if k not in named}


def resolve_device(device):
    """A jax Device from None (JAX's default), a platform name ("cpu", "gpu") or a Device."""
    jax = require_jax()
    if device is None:
        return jax.devices()[0]
    if isinstance(device, str):
        try:
            return jax.devices(device)[0]
        except RuntimeError as exc:
            raise UnsupportedError(f"XlaDelegate: JAX has no {device!r} device here ({exc})") from None
    return device


class XlaPartitionKernel(DelegateKernel):
    """One claimed partition: an XLA executable per input signature, LRU-cached.

    The partition's weights are closed over, so XLA sees them as constants (it can fold and
    re-lay them out at compile time) and a call hands the executable only the run-time
    inputs: with a hundred weight arguments, JAX's argument handling alone cost more than
    a small model's whole LiteRT invoke (bench/xla_bench.py).
    """

    def __init__(self, delegate: "XlaDelegate", partition: Partition):
        self.delegate = delegate
        self.partition = partition
        first, last = partition.nodes[0].index, partition.nodes[-1].index
        self.label = f"XLA delegate, nodes {first}..{last}"
        index_of = {id(info.op): info.index for info in partition.nodes}
        self.nodes = prepare_nodes([info.op for info in partition.nodes],
                                   lambda op: f"XLA delegate, node {index_of[id(op)]} ({op.name})")
        static = delegate._static_set(partition.nodes[0].op)
        # Resource handles entering the partition are static too: READ / ASSIGN resolve them.
        static = static | {id(t) for t in partition.inputs if t.dtype == DType.RESOURCE}
        self.static_inputs = [k for k, t in enumerate(partition.inputs) if id(t) in static]
        self.dynamic_inputs = [k for k, t in enumerate(partition.inputs) if id(t) not in static]
        #: Resource variables the partition reads and writes (kiln/xla/partition_vars.py), or None.
        self.variables = PartitionVariables.of(partition, self.nodes, self.label)
        self.param_tensors = param_tensors(self.nodes)
        # Variable tensors whose final state a node leaves (sequence-LSTM states): written
        # back into the interpreter's buffers for them, as LiteRT's kernels do.
        position = {id(t): k for k, t in enumerate(partition.inputs)}
        self.state_inputs = []
        for n in self.nodes:
            for k in n.lowering.state:
                t = n.op.inputs[k] if k < len(n.op.inputs) else None
                if t is not None and id(t) in position and position[id(t)] not in self.state_inputs:
                    self.state_inputs.append(position[id(t)])
        # Outputs that are variable tensors (an LSTM's state written by a FILL here) get
        # writable buffers: the node that reads and updates them may run elsewhere.
        self.variable_outputs = [k for k, t in enumerate(partition.outputs) if t.is_variable]
        float_dtype = delegate.float_dtype
        with x64():
            self.weights = [self._param_value(t, float_dtype) for t in self.param_tensors]
        self.cache: OrderedDict = OrderedDict()
        self.compiles = 0
        #: Seconds the first invoke spent tracing and compiling (and running once).
        self.compile_seconds: float | None = None

    @staticmethod
    def _param_value(t, float_dtype):
        data = np.asarray(t.data)
        if float_dtype is not None and data.dtype == np.float32:
            import jax.numpy as jnp

            return jnp.asarray(data, dtype=float_dtype)
        return data

    def _trace_fn(self, static_values: dict[int, np.ndarray], plan=None):
        """The partition as a function of its dynamic inputs (weights and statics closed over),
        then of the variables ``plan`` reads; it returns the ones ``plan`` writes last."""
        partition, nodes = self.partition, self.nodes
        inputs, params, dynamic = partition.inputs, self.param_tensors, self.dynamic_inputs
        float_dtype = self.delegate.float_dtype
        state_inputs, weights = self.state_inputs, self.weights
        variables = self.variables

        def fn(*args):
            if plan is None:
                return body(*args)
            with variables.tracing(plan, args[len(dynamic):]) as store:
                outs, states = body(*args[:len(dynamic)])
            return outs, states, variables.written(store, plan)

        def body(*dynamic_values):
            env = {id(t): v for t, v in zip(params, weights)}
            for k, value in static_values.items():
                env[id(inputs[k])] = value
            for k, value in zip(dynamic, dynamic_values):
                if float_dtype is not None and value.dtype == np.float32:
                    value = value.astype(float_dtype)
                env[id(inputs[k])] = value
            updates = run_nodes(nodes, env, float_dtype)
            states = [updates.get(id(inputs[k]), env[id(inputs[k])]) for k in state_inputs]
            outs = []
            for t in partition.outputs:
                value = env[id(t)]
                want = t.dtype.numpy
                outs.append(value.astype(want) if value.dtype != want else value)
            return outs, [s.astype(inputs[k].dtype.numpy) for k, s in zip(state_inputs, states)]

        return fn

    def _compile(self, static_values: dict[int, np.ndarray], dynamic_values: Sequence, plan=None):
        """Trace, lower and compile once for these input shapes: calling the executable skips
        jax.jit's per-call cache lookup."""
        jax = require_jax()
        from jax.sharding import SingleDeviceSharding

        where = SingleDeviceSharding(self.delegate.device)
        specs = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=where) for x in dynamic_values]
        lowered = jax.jit(self._trace_fn(static_values, plan)).lower(*specs)
        try:
            return lowered.compile(self.delegate.compiler_options or None)
        except Exception as exc:  # XLA's own errors (an unknown compiler option, say)
            raise OpError(f"{self.label}: XLA cannot compile the partition for input shapes "
                          f"{[list(np.shape(x)) for x in dynamic_values]}: {type(exc).__name__}: {exc}") from exc

    def _call(self, run, dynamic_values):
        # On the default device NumPy inputs go straight in (the call transfers them, much
        # faster than a device_put of its own); elsewhere they are put there first.
        if self.delegate.device_is_default:
            return run(*dynamic_values)
        put = require_jax().device_put
        return run(*[put(x, self.delegate.device) for x in dynamic_values])

    def _refusal(self, exc: KilnError) -> Exception:
        """A node that cannot be lowered for these inputs (a loop whose carried shapes change,
        a slice XLA cannot size): the interpreter runs it on its reference kernel instead
        (NodesRefused). Other failures stay errors."""
        op = getattr(exc, "lowering_op", None)
        node = next((info for info in self.partition.nodes if info.op is op), None)
        if node is None:
            return exc
        return self.delegate.refused_at_run(self, [node], f"XLA cannot lower it for these inputs: {exc}")

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        dynamic_values = [inputs[k] for k in self.dynamic_inputs]
        key = tuple((x.shape, x.dtype.char) if isinstance(x, np.ndarray) else (np.shape(x), np.asarray(x).dtype.char)
                    for x in dynamic_values)
        if self.static_inputs:
            static_values = {k: np.asarray(inputs[k]) for k in self.static_inputs}
            key += tuple((v.shape, v.dtype.str, v.tobytes()) for v in static_values.values())
        # The call needs JAX's 64-bit mode only for 64-bit inputs (which it would otherwise
        # narrow); entering it costs about a quarter of a small executable's call.
        wide = any(k[1] in _WIDE for k in key[:len(dynamic_values)])
        plan = None
        if self.variables is not None:
            self.variables.before()  # CALL_ONCE inits, through the interpreter
            plan = self.variables.plan(inputs)
            var_values = self.variables.values(plan)
            key += (plan.reads, plan.writes) + self.variables.key(var_values)
            dynamic_values = dynamic_values + var_values
            wide = wide or any(np.dtype(v.dtype).char in _WIDE for v in var_values)
        run = self.cache.get(key)
        fresh = run is None
        if fresh:
            start = time.perf_counter()
            with x64():
                try:
                    run = self._compile(static_values if self.static_inputs else {}, dynamic_values, plan)
                except KilnError as exc:
                    raise self._refusal(exc) from None
            self.cache[key] = run
            self.compiles += 1
            while len(self.cache) > self.delegate.cache_size:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        if wide:
            with x64():
                outs, states, *written = self._call(run, dynamic_values)
        else:
            outs, states, *written = self._call(run, dynamic_values)
        if fresh:
            require_jax().block_until_ready(outs)
            if self.compile_seconds is None:
                self.compile_seconds = time.perf_counter() - start
        if plan is not None:
            self.variables.after(plan, written[0])
        for k, value in zip(self.state_inputs, states):
            buffer = inputs[k]
            if not (isinstance(buffer, np.ndarray) and buffer.flags.writeable):
                raise OpError(f"{self.label}: cannot write the final state of variable "
                              f"{self.partition.inputs[k].name!r} back (its buffer is read-only)")
            np.copyto(buffer, np.asarray(value).reshape(buffer.shape))
        results = [np.asarray(o) for o in outs]
        for k in self.variable_outputs:
            results[k] = np.array(results[k])
        return results


class XlaDelegate(ReportingDelegate):
    """Claims every node with an XLA lowering; runs each partition as one compiled function.

    Args:
      device: where to run — None (JAX's default device), "cpu", "gpu", or a jax Device.
      dtype_policy: None / "float32" (compute as the model says) or "bfloat16" (float32
        weights and activations computed in bfloat16; outputs come back as float32).
      cache_size: compiled input signatures kept per partition (least recently used dropped).
      ops: restrict the delegate to these op names (default: every op with a lowering).
      compiler_options: XLA options for its compiles, as ``jax.stages.Lowered.compile`` takes
        them (e.g. ``{"xla_cpu_multi_thread_eigen": True}``); on a CPU they extend
        `CPU_COMPILER_OPTIONS` (single-threaded, YNNPACK fusions off; see `cpu_defaults`).

    After an interpreter prepares, ``claimed`` lists (node index, op name, version) of the
    nodes the delegate took, ``rejected`` maps each refused node to the reason, and
    ``kernels`` holds one `XlaPartitionKernel` per partition.
    """

    name = "xla"

    def __init__(self, device=None, dtype_policy: str | None = None, cache_size: int = 8,
                 ops: Iterable[str] | None = None, compiler_options: dict | None = None):
        require_jax()
        super().__init__()
        known = set(lowered_ops())
        self.ops = frozenset(known if ops is None else ops)
        if self.ops - known:
            raise UnsupportedError(f"XlaDelegate: no lowering for {sorted(self.ops - known)}")
        if dtype_policy not in _POLICIES:
            raise UnsupportedError(f"XlaDelegate: dtype_policy {dtype_policy!r} is not one of "
                                   f"{sorted(p for p in _POLICIES if p)} (or None)")
        if not isinstance(cache_size, int) or cache_size < 1:
            raise UnsupportedError(f"XlaDelegate: cache_size must be a positive int, got {cache_size!r}")
        self.device = resolve_device(device)
        self.device_is_default = self.device == require_jax().devices()[0]
        self.dtype_policy = dtype_policy
        self.float_dtype = None
        if _POLICIES[dtype_policy] is not None:
            import jax.numpy as jnp

            self.float_dtype = jnp.bfloat16
        self.cache_size = cache_size
        if compiler_options is not None and not isinstance(compiler_options, dict):
            raise UnsupportedError(f"XlaDelegate: compiler_options must be a dict, got {compiler_options!r}")
        defaults = cpu_defaults() if self.device.platform == "cpu" else {}
        self.compiler_options = {**defaults, **(compiler_options or {})}
        self._static: dict[int, set[int]] = {}

    def _static_set(self, op) -> set[int]:
        sg = op.subgraph
        key = id(sg)
        if key not in self._static:
            self._static[key] = static_tensors(sg) if sg is not None else set()
        return self._static[key]

    def why_not(self, node: NodeInfo) -> str | None:
        reason = why_not_vars(node.op)  # CALL_ONCE's inits run before the partition
        if reason is not None:
            return reason
        if node.op.op_type != "CUSTOM" and node.name not in self.ops and node.name in lowered_ops():
            return f"{node.name} is left out of this delegate's ops"
        return why_not_lowered(node.op, node.registration, self._static_set(node.op))

    def make_kernel(self, partition: Partition) -> XlaPartitionKernel:
        return XlaPartitionKernel(self, partition)

    @property
    def compile_seconds(self) -> float:
        """First-invoke trace + compile time summed over the partitions compiled so far."""
        return sum(k.compile_seconds or 0.0 for k in self.kernels)
