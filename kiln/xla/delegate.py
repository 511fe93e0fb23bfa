"""XlaDelegate: runs every node that has a lowering through JAX/XLA.

Each partition (a maximal run of claimed nodes) becomes one jitted function. XLA compiles
static shapes, so a partition is compiled once per input signature — the shapes and types of
its run-time inputs plus the values of its static inputs — and the compiled functions live
in a bounded LRU cache. A node that turns out not to lower for the inputs it meets (a loop
whose carried shape changes) is handed back while tracing (NodesRefused): the interpreter
runs it on its reference kernel from then on, and the rest of the partition stays with XLA.

Weights live on the device: every constant a traced partition reads that is at least
`ARG_MIN_BYTES` big (weights, and what the kernels' ``prepare`` computed from them) becomes an
argument of its executable, put on the device once (shared by every input signature and
partition of the delegate) and handed to each call, never an HLO literal (XLA GPU folds and
compiles large literals slowly). Outputs that only this delegate's nodes read stay device
arrays between partitions.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from ..errors import KilnError, OpError, UnsupportedError
from ..schema import DType
from ..runtime.delegate import DelegateKernel, NodeInfo, Partition, ReportingDelegate
from ._jax import enable_compilation_cache, require_jax, x64
from .exported import ExportFile
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


#: Constants of a traced partition this big or bigger become device-resident arguments of its
#: executable; smaller ones (shapes, scalars, small tables) stay HLO literals XLA can fold.
ARG_MIN_BYTES = 1024
#: On a CPU, a partition whose large constants total less than this keeps them as literals
#: (``weights=None``). Measured on the shared 2-core CPU (jax 0.10, docs/xla.md): arguments cost
#: about 0.3 us each per call and the folding XLA does on literals, so batch-1 invokes of small
#: models ran 10-20% slower (MobileNetV2 0.35 at 32x32: 69 arguments, 0.108 -> 0.128 ms; the
#: LSTM 2x128: 0.54 -> 0.61 ms), while MobileNetV2 1.0 at 224 (14 MB) and the 2-block
#: transformer (6 MB) ran within noise and compiled faster with arguments (3.3 -> 2.7 s, 1.9 -> 1.7 s).
CPU_LITERAL_BYTES = 4 << 20


def _signature(x) -> tuple:
    """A run-time input's part of the compile key (no host copy of a device array)."""
    return (tuple(x.shape), np.dtype(x.dtype).char) if hasattr(x, "dtype") else \
        (np.shape(x), np.asarray(x).dtype.char)


def _free_batch(t) -> bool:
    """A tensor of rank >= 1 whose first dimension is free (the batch)."""
    sig = t.shape_signature
    return sig is not None and len(sig) >= 1 and int(sig[0]) == -1


def _pad_rows(x, size: int) -> np.ndarray:
    """``x`` with its last row repeated up to ``size`` rows (real values: no 0/0 in the padding)."""
    x = np.asarray(x)
    return np.concatenate([x, np.repeat(x[-1:], size - x.shape[0], axis=0)])


class Executable:
    """A compiled partition and the device arrays of its hoisted constants, passed every call."""

    def __init__(self, compiled, weights: list):
        self.compiled, self.weights = compiled, weights

    def __call__(self, *args):
        return self.compiled(self.weights, *args)

    def as_text(self) -> str:
        """The optimized HLO XLA compiled."""
        return self.compiled.as_text()


def _eval_jaxpr():
    """JAX's jaxpr evaluator (public in jax.core; its private home should that name move)."""
    jax = require_jax()
    found = getattr(jax.core, "eval_jaxpr", None)
    if found is None:
        from jax._src.core import eval_jaxpr as found
    return found


def hoisted(fn, specs: Sequence, put, hoists=lambda total: True) -> tuple:
    """``fn`` traced for ``specs``, as ``(g, weights)``: ``g(weights, *args)`` computes what ``fn``
    does, with each constant of the trace of at least `ARG_MIN_BYTES` taken from ``weights``
    (``put(array)`` -> its device array) instead of being baked into the HLO — unless
    ``hoists(their total bytes)`` says no."""
    jax = require_jax()
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*specs)
    tree = jax.tree_util.tree_structure(shape)
    consts = list(closed.consts)
    size = [np.size(c) * np.dtype(c.dtype).itemsize for c in consts]
    big = [k for k, n in enumerate(size) if n >= ARG_MIN_BYTES]
    if not hoists(sum(size[k] for k in big)):
        big = []
    weights = [put(consts[k]) for k in big]
    for k in big:
        consts[k] = None  # the host copy is not kept
    jaxpr = closed.jaxpr

    def g(weights, *args):
        values = list(consts)
        for k, w in zip(big, weights):
            values[k] = w
        return jax.tree_util.tree_unflatten(tree, _eval_jaxpr()(jaxpr, values, *args))

    return g, weights


class XlaPartitionKernel(DelegateKernel):
    """One claimed partition: an XLA executable per input signature, LRU-cached.

    The trace's large constants are hoisted into device-resident arguments (`hoisted`).
    """

    exact_outputs = True

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
            self.param_values = [self._param_value(t, float_dtype) for t in self.param_tensors]
        self.cache: OrderedDict = OrderedDict()
        self.compiles = 0
        #: (padded inputs, sliced outputs) when batches are padded to the delegate's batch_sizes.
        self.buckets = self._bucketing(delegate.batch_sizes)
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
        state_inputs, weights = self.state_inputs, self.param_values
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
                # under the policy, float32 inputs compute in bfloat16; states (an LSTM's, in
                # variable tensors) stay float32, as LiteRT keeps them
                if float_dtype is not None and value.dtype == np.float32 and k not in state_inputs:
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

    def _compile(self, static_values: dict[int, np.ndarray], dynamic_values: Sequence, plan=None, program=None):
        """Trace once for these input shapes, hoist the large constants into device arguments,
        lower and compile: calling the executable skips jax.jit's per-call cache lookup. With
        ``program`` (an exported function and its weights, kiln/xla/exported.py), nothing is traced."""
        jax = require_jax()
        from jax.sharding import SingleDeviceSharding

        where = SingleDeviceSharding(self.delegate.device)
        specs = [jax.ShapeDtypeStruct(shape, np.dtype(code), sharding=where) for shape, code in map(_signature, dynamic_values)]
        fn, weights = program or hoisted(self._trace_fn(static_values, plan), specs, self.delegate.device_weight,
                                         self.delegate.hoists)
        wspecs = [jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=where) for w in weights]
        if self.delegate.recorder is not None and program is None:  # exported.export_model: compiled from its export
            fn = self.delegate.recorder.export(self, fn, weights, wspecs, specs)
        try:
            compiled = jax.jit(fn).lower(wspecs, *specs).compile(self.delegate.compiler_options or None)
        except Exception as exc:  # XLA's own errors (an unknown compiler option, say)
            raise OpError(f"{self.label}: XLA cannot compile the partition for input shapes "
                          f"{[list(s.shape) for s in specs]}: {type(exc).__name__}: {exc}") from exc
        return Executable(compiled, weights)

    def restore(self, key, program, weights) -> None:
        """Compile an exported ``program`` for input signature ``key`` and keep it (no tracing)."""
        with x64():
            specs = [require_jax().ShapeDtypeStruct(shape, np.dtype(code)) for shape, code in key]
            self._keep(key, self._compile({}, specs, program=(program, weights)))

    def _call(self, run, dynamic_values):
        # On the default device NumPy inputs go straight in (the call transfers them, much
        # faster than a device_put of its own); elsewhere they are put there first. Device
        # arrays (another partition's outputs) are passed as they are.
        if self.delegate.device_is_default:
            return run(*dynamic_values)
        put, device = require_jax().device_put, self.delegate.device
        return run(*[x if getattr(x, "device", None) == device else put(x, device) for x in dynamic_values])

    def _refusal(self, exc: KilnError) -> Exception:
        """A node that cannot be lowered for these inputs (a loop whose carried shapes change,
        a slice XLA cannot size): the interpreter runs it on its reference kernel instead
        (NodesRefused). Other failures stay errors."""
        op = getattr(exc, "lowering_op", None)
        node = next((info for info in self.partition.nodes if info.op is op), None)
        if node is None:
            return exc
        return self.delegate.refused_at_run(self, [node], f"XLA cannot lower it for these inputs: {exc}")

    def _bucketing(self, sizes: Sequence[int]) -> tuple | None:
        """(padded input positions, sliced output positions) when this partition's batches can be
        padded up to ``sizes``: every run-time input is a model input whose first dimension is
        free (the batch), as TF Serving's batching pads them; else None (compiled per shape)."""
        if not sizes or self.variables is not None or self.state_inputs or not self.dynamic_inputs:
            return None
        sg = self.partition.nodes[0].op.subgraph
        model_inputs = {id(t) for t in sg.inputs} if sg is not None else set()
        for k in self.dynamic_inputs:
            t = self.partition.inputs[k]
            if id(t) not in model_inputs or not _free_batch(t):
                return None
        return (tuple(range(len(self.dynamic_inputs))),
                frozenset(k for k, t in enumerate(self.partition.outputs) if _free_batch(t)))

    def _padded_rows(self, values) -> tuple[int, int] | None:
        """(rows, bucket) when this call's batch is padded up to a larger bucket, else None."""
        if self.buckets is None:
            return None
        rows = {np.shape(x)[0] if np.ndim(x) else None for x in values}
        if len(rows) != 1 or None in rows:
            return None
        (n,) = rows
        if n == 0:
            return None
        size = next((b for b in self.delegate.batch_sizes if b >= n), n)
        return (n, size) if size != n else None

    def warmup(self) -> int:
        """Compile every batch bucket now (at load) for the model's other dimensions: the number
        compiled. Partitions with inputs known only at run time (static values, variables) or
        other free dimensions compile on their first invoke instead."""
        if self.buckets is None or self.static_inputs:
            return 0
        tensors = [self.partition.inputs[k] for k in self.dynamic_inputs]
        if any(-1 in list(t.shape_signature)[1:] for t in tensors if t.shape_signature is not None):
            return 0
        jax, done = require_jax(), 0
        for size in self.delegate.batch_sizes:
            specs = [jax.ShapeDtypeStruct((size, *t.shape[1:]), np.dtype(t.dtype.numpy)) for t in tensors]
            key = tuple(_signature(x) for x in specs)
            if key not in self.cache:
                self._executable(key, {}, specs)
                done += 1
        return done

    def _executable(self, key, static_values, dynamic_values, plan=None):
        """Compile for ``key`` and keep it (the least recently used one goes past cache_size)."""
        with x64():
            try:
                run = self._compile(static_values, dynamic_values, plan)
            except KilnError as exc:
                raise self._refusal(exc) from None
        return self._keep(key, run)

    def _keep(self, key, run):
        self.cache[key] = run
        self.compiles += 1
        while len(self.cache) > self.delegate.cache_size:
            self.cache.popitem(last=False)
        return run

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        dynamic_values = [inputs[k] for k in self.dynamic_inputs]
        rows = self._padded_rows(dynamic_values)
        if rows is not None:
            dynamic_values = [_pad_rows(x, rows[1]) for x in dynamic_values]
        key = tuple(_signature(x) for x in dynamic_values)
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
            run = self._executable(key, static_values if self.static_inputs else {}, dynamic_values, plan)
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
        # Outputs only this delegate reads stay on the device; padded rows are cut on the host.
        keep = self.delegate.on_device(self) if rows is None else frozenset()
        results = [o if k in keep else np.asarray(o) for k, o in enumerate(outs)]
        if rows is not None:
            results = [o[:rows[0]] if k in self.buckets[1] else o for k, o in enumerate(results)]
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
      weights: "arguments" (the partitions' weights are device-resident arguments of their
        executables), "constants" (HLO literals), or None: arguments, except on a CPU for a
        partition whose weights total under `CPU_LITERAL_BYTES` (there literals run faster).
      batch_sizes: batch buckets (kiln serve's ``allowed_batch_sizes``): a partition whose
        inputs are model inputs of free batch pads a batch up to the next bucket and slices
        its outputs back (rows must not mix, as for TF Serving's batching), and compiles every
        bucket when the interpreter prepares it; a batch past the last bucket compiles as is.
      export: a file `kiln.xla.export_model` wrote (``kiln xla-export``): the executables it holds
        are compiled from its saved programs, without tracing; an export of other model bytes,
        policy, platform or kiln version, or one unreadable, is ignored with a warning.
      compiler_options: XLA options for its compiles, as ``jax.stages.Lowered.compile`` takes
        them (e.g. ``{"xla_cpu_multi_thread_eigen": True}``); on a CPU they extend
        `CPU_COMPILER_OPTIONS` (single-threaded, YNNPACK fusions off; see `cpu_defaults`).

    After an interpreter prepares, ``claimed`` lists (node index, op name, version) of the
    nodes the delegate took, ``rejected`` maps each refused node to the reason, and
    ``kernels`` holds one `XlaPartitionKernel` per partition.
    """

    name = "xla"

    def __init__(self, device=None, dtype_policy: str | None = None, cache_size: int = 8,
                 ops: Iterable[str] | None = None, compiler_options: dict | None = None,
                 weights: str | None = None, batch_sizes: Sequence[int] | None = None, export=None):
        require_jax()
        enable_compilation_cache()
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
        sizes = [] if batch_sizes is None else list(batch_sizes)
        if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
            raise UnsupportedError(f"XlaDelegate: batch_sizes must be positive ints, got {batch_sizes!r}")
        self.batch_sizes = sorted({int(b) for b in sizes})
        self.cache_size = max(cache_size, len(self.batch_sizes) + 1)
        if weights not in (None, "arguments", "constants"):
            raise UnsupportedError(f"XlaDelegate: weights must be 'arguments', 'constants' or None, got {weights!r}")
        self.weights = weights
        if compiler_options is not None and not isinstance(compiler_options, dict):
            raise UnsupportedError(f"XlaDelegate: compiler_options must be a dict, got {compiler_options!r}")
        defaults = cpu_defaults() if self.device.platform == "cpu" else {}
        self.compiler_options = {**defaults, **(compiler_options or {})}
        self._static: dict[int, set[int]] = {}
        self._weights: dict[tuple, object] = {}
        self._kept: dict[int, tuple] = {}
        self.export = None if export is None else ExportFile(export)
        #: Partition executables built from ``export``; a `Recorder` when export_model writes one.
        self.from_export, self.recorder = 0, None

    def hoists(self, total_bytes: int) -> bool:
        """Whether a partition's large constants (``total_bytes`` together) become arguments."""
        if self.weights is not None:
            return self.weights == "arguments"
        return self.device.platform != "cpu" or total_bytes >= CPU_LITERAL_BYTES

    def device_weight(self, value):
        """``value``'s array on the device, put there once: equal constants (one weight traced for
        two batch sizes, or read by two partitions) share one device buffer."""
        data = np.asarray(value)
        key = (data.shape, data.dtype.str, hashlib.blake2b(data.tobytes(), digest_size=16).digest())
        if key not in self._weights:
            self._weights[key] = require_jax().device_put(data, self.device)
        return self._weights[key]

    def on_device(self, kernel: XlaPartitionKernel) -> frozenset:
        """Positions of ``kernel``'s outputs it returns as device arrays: those every reader of
        is a node of another partition of this delegate (never a subgraph output or a variable,
        which get_tensor reads). Recomputed when the partitions change (a node refused at run)."""
        stamp = tuple(id(k) for k in self.kernels)
        kept = self._kept.get(id(kernel))
        if kept is None or kept[0] != stamp:
            ours = {id(info.op) for k in self.kernels for info in k.partition.nodes}
            sg = kernel.partition.nodes[0].op.subgraph
            ends = {id(t) for t in sg.outputs} if sg is not None else None
            keep = set()
            for k, t in enumerate(kernel.partition.outputs):
                if ends is None or id(t) in ends or t.is_variable:
                    continue
                readers = [op for op in sg.operators if any(x is t for x in op.inputs)]
                if readers and all(id(op) in ours for op in readers):
                    keep.add(k)
            kept = self._kept[id(kernel)] = (stamp, frozenset(keep))
        return kept[1]

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
        kernel = XlaPartitionKernel(self, partition)
        if self.export is not None:
            self.from_export += self.export.restore(kernel)
        kernel.warmup()
        return kernel

    @property
    def compile_seconds(self) -> float:
        """First-invoke trace + compile time summed over the partitions compiled so far."""
        return sum(k.compile_seconds or 0.0 for k in self.kernels)
