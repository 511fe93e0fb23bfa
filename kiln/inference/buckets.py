"""The I/O shape stage: dynamic dimensions padded up to buckets around each accelerator call.

XLA compiles once per distinct input shape (inference.md E2b), so a model served at every batch
size from 1 to 64 would compile 64 times. Each call of an accelerator function is routed through
a small CPU function that pads the batch dimension of its inputs with zeros up to the next bucket
(the batch options' ``allowed_batch_sizes``, else powers of two up to ``max_batch_bucket``), calls
the function (that call site, only, is marked for XLA) and slices the padding off the outputs:
at most one compilation per bucket. Beyond the largest bucket, sizes round up to a multiple of
it. kiln's ``experimental { dimension_buckets { input dimension sizes } }`` buckets another
dimension (e.g. sequence length) the same way; outputs whose same dimension is dynamic are sliced
back. Padding is zeros: the function must not mix rows (or masked positions) — the report
measures the converted model against the unpadded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .options import OptionsError
from .rewrite import call_sites
from .savedmodel import DT_RESOURCE, arg_shape, live_functions, reachable, rename_output_port, user_name

DEFAULT_MAX_BATCH_BUCKET = 64
PREFIX = "__kiln_bucketed_"


@dataclass
class Bucketed:
    """One accelerator function routed through a padding wrapper (for the report)."""

    function: str
    wrapper: str
    batch_buckets: list
    dimension_buckets: dict = field(default_factory=dict)  # "input[dim]" -> sizes
    call_sites: int = 0
    batch_ops: list = field(default_factory=list)  # rewrite.BatchedSite: one queue per bucket (routed)
    routers: list = field(default_factory=list)  # the router functions put in front of batch ops
    replaced: list = field(default_factory=list)  # (caller, node) of the batch ops the router took over

    @property
    def max_compiles(self) -> int:
        n = len(self.batch_buckets) or 1
        for sizes in self.dimension_buckets.values():
            n *= len(sizes)
        return n


def powers_of_two(limit: int) -> list[int]:
    sizes, n = [], 1
    while n < limit:
        sizes.append(n)
        n *= 2
    return sizes + [limit]


def _check_sizes(sizes, where: str) -> list[int]:
    sizes = list(sizes)
    if not sizes or any(s <= 0 for s in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise OptionsError(f"{where}: sizes must be positive and increasing, got {sizes}")
    return sizes


def _output_shapes(node) -> list:
    if "_output_shapes" not in node.attr:
        return []
    return [None if s.unknown_rank else [None if d.size < 0 else d.size for d in s.dim]
            for s in node.attr["_output_shapes"].list.shape]


def _bucket(n, sizes):
    """The smallest bucket >= n; beyond the largest, the next multiple of it."""
    import tensorflow as tf

    table = tf.constant(sizes, dtype=tf.int32)
    largest = sizes[-1]
    index = tf.minimum(tf.searchsorted(table, tf.reshape(n, [1]), side="left")[0], len(sizes) - 1)
    return tf.where(n <= largest, tf.gather(table, index), (n + largest - 1) // largest * largest)


def _pad_to(x, dim: int, size):
    import tensorflow as tf

    rank = x.shape.rank
    extra = size - tf.shape(x)[dim]
    paddings = tf.one_hot(dim, rank, dtype=tf.int32)[:, None] * tf.stack([0, 1])[None, :] * extra
    return tf.pad(x, paddings)


def _slice_dim(y, dim: int, size, rank: int):
    import tensorflow as tf

    begin = tf.zeros([rank], tf.int32)
    sizes = tf.tensor_scatter_nd_update(tf.fill([rank], -1), [[dim]], tf.reshape(size, [1]))
    return tf.slice(y, begin, sizes)


def build_wrapper(target, out_shapes, batch_args, batch_sizes, dims: dict):
    """FunctionDef of the padding wrapper around ``target`` (a FunctionDef)."""
    import tensorflow as tf
    from tensorflow.python.ops import gen_functional_ops

    args = target.signature.input_arg
    specs = []
    for i, a in enumerate(args):
        shape = None if a.type == DT_RESOURCE else arg_shape(target, i)
        specs.append(tf.TensorSpec([] if a.type == DT_RESOURCE else shape, tf.dtypes.as_dtype(a.type)))
    out_types = [o.type for o in target.signature.output_arg]

    def body(*xs):
        xs = list(xs)
        rows = tf.shape(xs[batch_args[0]])[0] if batch_args else None
        if batch_args:
            target_rows = _bucket(rows, batch_sizes)
            for i in batch_args:
                xs[i] = _pad_to(xs[i], 0, target_rows)
        original = {}
        for i, (dim, sizes) in dims.items():
            original[dim] = tf.shape(xs[i])[dim]
            xs[i] = _pad_to(xs[i], dim, _bucket(original[dim], sizes))
        outs = gen_functional_ops.stateful_partitioned_call(args=xs, Tout=out_types, f=target.signature.name)
        result = []
        for y, shape in zip(outs, out_shapes):
            if batch_args:
                y = y[:rows]
            for dim, size in original.items():
                if shape and dim < len(shape) and shape[dim] is None:
                    y = _slice_dim(y, dim, size, len(shape))
            result.append(y)
        return result

    concrete = tf.function(body, input_signature=specs, autograph=False).get_concrete_function()
    fdef = concrete.function_def
    for node in fdef.node_def:
        if node.op == "StatefulPartitionedCall" and node.attr["f"].func.name == target.signature.name:
            node.attr["_XlaMustCompile"].b = True
    return fdef


def _dimension_plan(target, entries, name: str) -> dict:
    names = {user_name(target, i): i for i in range(len(target.signature.input_arg))}
    dims = {}
    for k, e in enumerate(entries):
        where = f"experimental.dimension_buckets[{k}]"
        if e.input not in names:
            continue
        i = names[e.input]
        shape = arg_shape(target, i)
        if shape is None or not 0 < e.dimension < len(shape):
            raise OptionsError(f"{where}: input {e.input!r} of {name!r} has shape {shape}; dimension must be "
                               f"between 1 and its rank - 1 (dimension 0 is the batch, bucketed already)")
        if shape[e.dimension] is not None:
            raise OptionsError(f"{where}: dimension {e.dimension} of input {e.input!r} of {name!r} is fixed "
                               f"({shape[e.dimension]}); only dynamic dimensions are bucketed")
        dims[i] = (e.dimension, _check_sizes(e.sizes, where))
    return dims


def _known_output_shapes(model, name: str, sites) -> list:
    """Output shapes of ``name`` from any call node that recorded them (kiln's batching wrapper
    calls do not; the BatchFunction node that replaced the original call does)."""
    for _, node in sites:
        if _output_shapes(node):
            return _output_shapes(node)
    for fdef in model.meta.graph_def.library.function:
        for node in fdef.node_def:
            if node.op == "BatchFunction" and node.attr["f"].func.name.endswith(name) and _output_shapes(node):
                return _output_shapes(node)
    return []


def apply(model, accelerator, batched: dict, experimental) -> tuple[list[Bucketed], list[str]]:
    """Route every call of each accelerator function through a padding wrapper.

    ``batched``: function -> the execution batch sizes of the BatchFunction that already pads it
    (its batch dimension is left to that op; other dimensions are still bucketed here)."""
    limit = experimental.max_batch_bucket or DEFAULT_MAX_BATCH_BUCKET
    if limit < 0:
        raise OptionsError(f"experimental.max_batch_bucket must be > 0, got {limit}")
    entries = list(experimental.dimension_buckets)
    all_inputs = {user_name(model.functions[a], i) for a in accelerator
                  for i, arg in enumerate(model.functions[a].signature.input_arg) if arg.type != DT_RESOURCE}
    for k, e in enumerate(entries):
        if e.input not in all_inputs:
            raise OptionsError(f"experimental.dimension_buckets[{k}]: no accelerator function has an input "
                               f"{e.input!r}; their inputs are {sorted(all_inputs)}")
    done, notes = [], []
    on_xla = set(accelerator).union(*(reachable(model, a) for a in accelerator)) if accelerator else set()
    live = live_functions(model)
    for name in sorted(accelerator):
        target = model.functions[name]
        # calls inside another accelerator function compile into its cluster, at its shapes: no padding
        sites = [(c, n) for c, n in call_sites(model, name)
                 if c is not None and c.signature.name not in on_xla and c.signature.name in live]
        if not sites:
            continue
        out_shapes = _known_output_shapes(model, name, sites)
        dims = _dimension_plan(target, entries, name)
        if name in batched:
            if dims:  # other dimensions are padded before the batch op: one queue per bucket
                done.append(route_batched(model, name, entries, list(batched[name]), live))
            else:  # BatchFunction pads to its sizes already: nothing to add
                done.append(Bucketed(name, "(BatchFunction)", list(batched[name]), {}, len(sites)))
            continue
        else:
            batch_args = [i for i, a in enumerate(target.signature.input_arg)
                          if a.type != DT_RESOURCE and (arg_shape(target, i) or [0])[:1] == [None]]
            data_args = [i for i, a in enumerate(target.signature.input_arg) if a.type != DT_RESOURCE]
            batch_major = (batch_args == data_args and bool(out_shapes)
                           and all(s is not None and len(s) > 0 and s[0] is None for s in out_shapes))
            if not batch_major:
                notes.append(f"{name}: batch dimension not bucketed (its inputs or outputs are not all batch-major "
                             f"with a dynamic dimension 0)")
                batch_args = []
            sizes = powers_of_two(limit) if batch_args else []
        if not batch_args and not dims:
            continue
        wrapper = build_wrapper(target, out_shapes, batch_args, sizes, dims)
        wrapper.signature.name = PREFIX + name
        model.meta.graph_def.library.function.add().CopyFrom(wrapper)
        for _, node in sites:
            node.attr["f"].func.name = PREFIX + name
            if "_XlaMustCompile" in node.attr:
                del node.attr["_XlaMustCompile"]  # the wrapper's own call compiles; padding stays dynamic
        model.reindex()
        done.append(Bucketed(name, PREFIX + name, sizes,
                             {f"{user_name(target, i)}[{d}]": s for i, (d, s) in dims.items()}, len(sites)))
    return done, notes


# -- dimension buckets in front of a batch op ----------------------------------------------------
# BatchFunction concatenates concurrent requests, so they must agree on every dimension but the
# batch: requests of lengths 5 and 11 padded after the batch op fail together ("Dimensions of
# inputs should match"). So a batched function's other dimensions are padded *before* the batch
# op, and each bucket gets a batch op (a queue) of its own: a Case on the bucket index picks it.
# Lengths beyond the largest bucket go to a last branch that runs the function unbatched.

ROUTER = "__kiln_routed_"


def _batch_ops_of(model, name: str, live: set) -> list:
    """(caller FunctionDef, BatchFunction node) of every live batch op that runs ``name``."""
    found = []
    for fdef in model.meta.graph_def.library.function:
        if fdef.signature.name not in live:
            continue
        for node in fdef.node_def:
            if node.op == "BatchFunction":
                f = node.attr["f"].func.name
                if f == name or name in reachable(model, f):
                    found.append((fdef, node))
    return found


def _branch(name: str, types: list, out_types: list, node=None, call: str | None = None):
    """A Case branch: the batch op ``node`` (a copy) or a plain call of ``call``, over its arguments."""
    from tensorflow.core.framework import function_pb2

    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    for j, t in enumerate(types):
        fdef.signature.input_arg.add(name=f"x{j}", type=t)
    for k, t in enumerate(out_types):
        fdef.signature.output_arg.add(name=f"y{k}", type=t)
    inner = fdef.node_def.add()
    if node is not None:
        inner.CopyFrom(node)
        inner.name, out = "batch", "out_tensors"
        del inner.input[:]
    else:
        inner.name, inner.op, out = "call", "StatefulPartitionedCall", "output"
        inner.attr["f"].func.name = call
        inner.attr["Tin"].list.type.extend(types)
        inner.attr["Tout"].list.type.extend(out_types)
    inner.input.extend(f"x{j}" for j in range(len(types)))
    for k in range(len(out_types)):
        fdef.ret[f"y{k}"] = f"{inner.name}:{out}:{k}"
    fdef.signature.is_stateful = True
    return fdef


def _router(wrapper, types: list, out_types: list, out_shapes: list, dims: dict, branches: list):
    """FunctionDef: pad each bucketed dimension, run the bucket's branch, slice the padding off."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.ops import gen_functional_ops

    specs = [tf.TensorSpec([] if t == DT_RESOURCE else arg_shape(wrapper, j), tf.dtypes.as_dtype(t))
             for j, t in enumerate(types)]
    refs = [attr_value_pb2.NameAttrList(name=b) for b in branches]

    def body(*xs):
        xs, original = list(xs), {}
        index, overflow = tf.constant(0), tf.constant(False)
        for i, (dim, sizes) in dims.items():
            n = tf.shape(xs[i])[dim]
            original[dim] = n
            table = tf.constant(sizes, dtype=tf.int32)
            position = tf.minimum(tf.searchsorted(table, tf.reshape(n, [1]), side="left")[0], len(sizes) - 1)
            index = index * len(sizes) + position
            overflow = tf.logical_or(overflow, n > sizes[-1])
            xs[i] = _pad_to(xs[i], dim, _bucket(n, sizes))
        branch = tf.where(overflow, len(branches) - 1, index)
        outs = gen_functional_ops.case(branch, xs, Tout=out_types, branches=refs)
        result = []
        for y, shape in zip(outs, out_shapes):
            for dim, size in original.items():
                if shape and dim < len(shape) and shape[dim] is None:
                    y = _slice_dim(y, dim, size, len(shape))
            result.append(y)
        return result

    return tf.function(body, input_signature=specs, autograph=False).get_concrete_function().function_def


def route_batched(model, name: str, entries, batch_sizes: list, live: set) -> Bucketed:
    """Put a bucketing router in front of every batch op running ``name`` (see above)."""
    import itertools

    from .rewrite import BatchedSite

    done = Bucketed(name, "", batch_sizes)
    library = model.meta.graph_def.library
    for n, (caller, node) in enumerate(_batch_ops_of(model, name, live)):
        wrapper = model.functions[node.attr["f"].func.name]
        dims = _dimension_plan(wrapper, entries, name)
        if not dims:
            continue
        types = list(node.attr["Tin"].list.type) + list(node.attr["Tcaptured"].list.type)
        out_types = list(node.attr["Tout"].list.type)
        base = f"{ROUTER}{name}_{n}"
        combos = list(itertools.product(*[range(len(sizes)) for _, sizes in dims.values()]))
        branches = []
        for c, combo in enumerate(combos):
            branch = _branch(f"{base}_bucket{c}", types, out_types, node=node)
            shared = node.attr["shared_name"].s.decode() + "/" + "x".join(
                str(sizes[k]) for (_, sizes), k in zip(dims.values(), combo))
            branch.node_def[0].attr["shared_name"].s = shared.encode()
            library.function.add().CopyFrom(branch)
            branches.append(branch.signature.name)
            attrs = {"max_batch_size": node.attr["max_batch_size"].i,
                     "allowed_batch_sizes": list(node.attr["allowed_batch_sizes"].list.i),
                     "batch_timeout_micros": node.attr["batch_timeout_micros"].i}
            done.batch_ops.append(BatchedSite(name, branch.signature.name, "batch", shared, attrs))
        overflow = _branch(f"{base}_beyond", types, out_types, call=wrapper.signature.name)
        library.function.add().CopyFrom(overflow)
        branches.append(overflow.signature.name)
        router = _router(wrapper, types, out_types, _output_shapes(node), dims, branches)
        router.signature.name = base
        library.function.add().CopyFrom(router)
        call = type(node)(name=node.name, op="StatefulPartitionedCall", device=node.device)
        call.input.extend(node.input)
        call.attr["f"].func.name = base
        call.attr["Tin"].list.type.extend(types)
        call.attr["Tout"].list.type.extend(out_types)
        if "_output_shapes" in node.attr:
            call.attr["_output_shapes"].CopyFrom(node.attr["_output_shapes"])
        done.replaced.append((caller.signature.name, node.name))
        node.CopyFrom(call)
        rename_output_port(caller, node.name, "out_tensors", "output")
        done.wrapper = done.wrapper or base
        done.routers.append(base)
        done.call_sites += 1
        done.dimension_buckets = {f"{user_name(wrapper, i)}[{d}]": s for i, (d, s) in dims.items()}
    model.reindex()
    return done
