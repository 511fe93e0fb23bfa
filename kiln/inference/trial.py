"""Trial compilation and costs, at conversion time, at representative shapes.

Each accelerator function is called through ``tf.function(jit_compile=True)`` with its real
variables (read from the checkpoint, so nothing else of the model is loaded) and lowered with
``experimental_get_compiler_ir(...)(stage="hlo")`` — TensorFlow's own tf2xla bridge, so an op XLA
cannot compile fails here, named, instead of at serving time. TensorFlow 2.21 exposes no XLA
cost analysis to Python, so kiln counts the HLO the bridge emitted the way XLA's HloCostAnalysis
does (dot/convolution 2 flops per multiply-add, 1 per element for elementwise and reduce ops;
bytes = operands + result). CPU ops are costed with TensorFlow's registered per-op flop
statistics (``ops.get_stats_for_node_def(..., "flops")``, what tf.compat.v1.profiler uses).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from ..errors import KilnError
from .savedmodel import (
    DT_RESOURCE,
    arg_shape,
    bound_inputs,
    callees,
    prefixed_copy,
    reachable,
    signature_wrapper,
    user_name,
)


class TrialCompileError(KilnError, RuntimeError):
    """XLA cannot compile a function selected for the accelerator."""


@dataclass
class FunctionCost:
    flops: int
    bytes_accessed: int
    shapes: list


# -- variables behind resource arguments -----------------------------------------------------

def _variable_values(model) -> dict:
    """object-graph node id -> numpy value, from the SavedModel's checkpoint."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = str(model.path / "variables" / "variables")
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception:  # a model without variables
        return {}
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    values = {}
    for node_id, node in enumerate(graph.nodes):
        for attr in node.attributes:
            if attr.name == "VARIABLE_VALUE":
                values[node_id] = reader.get_tensor(attr.checkpoint_key)
    return values


# -- registering the library under fresh names -----------------------------------------------

def _renamed_library(model, prefix: str):
    """Copies of every FunctionDef renamed ``prefix + name`` (eager contexts reject redefinitions)."""
    names = set(model.functions)
    return [prefixed_copy(fdef, names, prefix) for fdef in model.meta.graph_def.library.function]


_UNSUPPORTED = re.compile(r"(\w+) \(No registered '(\w+)' OpKernel for (XLA_\w+)")
_UNSUPPORTED_ALT = re.compile(r"[Uu]nsupported op[^:]*: (\w+)")
_NOT_CONSTANT = re.compile(r"Input (\d+) to node `([^`]+)` with op (\w+) must be a compile-time constant")


class Trial:
    """Compiles accelerator functions one by one with the model's real variables."""

    def __init__(self, model):
        from tensorflow.python.eager import context

        self.model = model
        self.prefix = f"__kiln_trial_{uuid.uuid4().hex[:8]}_"
        ctx = context.context()
        ctx.ensure_initialized()
        self.renamed = {}
        for fdef in _renamed_library(model, self.prefix):
            ctx.add_function_def(fdef)
            self.renamed[fdef.signature.name[len(self.prefix):]] = fdef
        self.binding = bound_inputs(model)
        self.values = None
        self.variables = {}

    def _variable(self, node_id):
        import tensorflow as tf

        if self.values is None:
            self.values = _variable_values(self.model)
        if node_id not in self.variables:
            if node_id not in self.values:
                raise TrialCompileError(f"variable (object node {node_id}) not found in the checkpoint")
            self.variables[node_id] = tf.Variable(self.values[node_id], trainable=False)
        return self.variables[node_id]

    def _ops_without_xla_kernel(self, name: str) -> set[str]:
        """Op types in ``name`` and its callees with no XLA JIT kernel (TF names only the first)."""
        from tensorflow.python.framework import kernels

        names = {name} | reachable(self.model, name)
        types = {n.op for f in names for n in self.model.functions[f].node_def if n.op not in self.model.functions}
        missing = set()
        for op in types:
            try:
                devices = {k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}
            except Exception:  # an op TensorFlow does not know: tf2xla's message names it
                continue
            if devices and not any(d.startswith("XLA_") and d.endswith("_JIT") for d in devices):
                missing.add(op)
        return missing

    def _constant(self, node_id):
        """The value of a captured constant (object-graph ``constant`` node -> the graph's Const)."""
        import tensorflow as tf

        node = self.model.meta.object_graph_def.nodes[node_id]
        if not node.HasField("constant"):
            return None
        for graph_node in self.model.meta.graph_def.node:
            if graph_node.name == node.constant.operation and graph_node.op == "Const":
                return tf.make_ndarray(graph_node.attr["value"].tensor)
        return None

    def arguments(self, name: str, batch: int):
        """(call, specs): a Python function taking the data arguments of ``name`` (variables and captured
        constants bound inside it, constants as graph constants so XLA sees their values) and the
        TensorSpecs of those arguments at batch size ``batch`` (other unknown dimensions 1)."""
        import tensorflow as tf
        from tensorflow.python.ops import gen_functional_ops

        fdef = self.model.functions[name]
        bound, specs = {}, []
        for i, arg in enumerate(fdef.signature.input_arg):
            node_id = self.binding.get((name, i))
            if arg.type == DT_RESOURCE:
                if node_id is None:
                    raise TrialCompileError(f"cannot trial-compile {name!r}: resource argument "
                                            f"{user_name(fdef, i)!r} is not bound to a variable kiln can find")
                bound[i] = ("variable", self._variable(node_id))
                continue
            value = self._constant(node_id) if node_id is not None else None
            if value is not None:
                bound[i] = ("constant", value)
                continue
            shape = arg_shape(fdef, i) or [batch]
            shape = [batch if k == 0 and d is None else (1 if d is None else d) for k, d in enumerate(shape)]
            dtype = tf.dtypes.as_dtype(arg.type)
            if dtype in (tf.string, tf.variant):
                raise TrialCompileError(f"accelerator function {name!r}: input {user_name(fdef, i)!r} is a "
                                        f"{dtype.name} tensor, which XLA cannot take; keep the function on the "
                                        f"CPU (do not select it) or select the function it calls after parsing")
            specs.append(tf.TensorSpec(shape, dtype))
        out_types = [o.type for o in fdef.signature.output_arg]

        def call(*xs):
            args, xs_it = [], iter(xs)
            for i, a in enumerate(fdef.signature.input_arg):
                kind, value = bound.get(i, (None, None))
                if kind == "variable":
                    args.append(value.handle)
                elif kind == "constant":
                    args.append(tf.constant(value, dtype=tf.dtypes.as_dtype(a.type)))
                else:
                    args.append(next(xs_it))
            return gen_functional_ops.stateful_partitioned_call(args=args, Tout=out_types, f=self.prefix + name)

        return call, specs

    def compile(self, name: str, batch: int) -> FunctionCost:
        """Lower ``name`` to HLO at batch size ``batch`` (unknown dims 1); costs of that HLO."""
        import tensorflow as tf

        call, specs = self.arguments(name, batch)
        jitted = tf.function(call, jit_compile=True, autograph=False)
        try:
            hlo = jitted.experimental_get_compiler_ir(*specs)(stage="hlo")
        except Exception as exc:  # tf.errors.*: name the op XLA refused
            msg = str(exc).replace(self.prefix, "")
            first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
            constant = _NOT_CONSTANT.search(msg)
            if constant:
                raise TrialCompileError(self._not_constant(name, *constant.groups()) + f" TensorFlow said: {first}") \
                    from None
            found = _UNSUPPORTED.findall(msg) or [(m, m, "XLA") for m in _UNSUPPORTED_ALT.findall(msg)]
            ops = sorted({op for _, op, _ in found} | self._ops_without_xla_kernel(name))
            what = f"op(s) {', '.join(ops)} cannot be compiled by XLA" if ops else "XLA cannot compile it"
            raise TrialCompileError(f"accelerator function {name!r}: {what}; keep it on the CPU (do not select "
                                    f"it) or move those ops out of it. TensorFlow said: {first}") from None
        flops, nbytes = hlo_costs(hlo)
        return FunctionCost(flops, nbytes, [list(s.shape) for s in specs])

    def _not_constant(self, name: str, index: str, node: str, op: str) -> str:
        """Why a shape argument is not a compile-time constant: the function inputs its value comes from."""
        sources, node = [], node.split("/")[-1]  # inlined calls prefix the caller's node names
        for fn in [name] + sorted(reachable(self.model, name)):
            fdef = self.model.functions[fn]
            nodes = {n.name: n for n in fdef.node_def}
            if node not in nodes:
                continue
            data = [i for i in nodes[node].input if not i.startswith("^")]
            args = {a.name: k for k, a in enumerate(fdef.signature.input_arg)}
            todo, seen = [data[int(index)]] if int(index) < len(data) else [], set()
            while todo:
                src = todo.pop().split(":")[0]
                if src in seen:
                    continue
                seen.add(src)
                if src in args:
                    sources.append(user_name(fdef, args[src]) + ("" if fn == name else f" (of {fn})"))
                elif src in nodes:
                    todo += [i for i in nodes[src].input if not i.startswith("^")]
            break
        came = (f" Its value comes from input(s) {', '.join(repr(x) for x in sorted(set(sources)))}, which XLA "
                f"sees only when the function runs.") if sources else ""
        return (f"accelerator function {name!r}: input {index} of node {node!r} ({op}) must be a compile-time "
                f"constant (a shape, axis or size), and it is computed at run time.{came} Compute it inside the "
                f"function from static shapes or tf.shape of its own inputs, pass it as a Python value, or keep "
                f"the function on the CPU.")


# -- HLO cost counting -----------------------------------------------------------------------

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
          "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([\w\-]+)\((.*)$")
_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "log", "tanh",
                "logistic", "rsqrt", "sqrt", "power", "negate", "abs", "compare", "select", "clamp", "remainder",
                "exponential-minus-one", "log-plus-one", "sine", "cosine", "erf", "floor", "ceil", "sign",
                "round-nearest-even", "round-nearest-afz", "atan2", "cbrt", "and", "or", "xor", "not"}
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "reshape", "after-all"}


def _elements(dims: str) -> int:
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n


def hlo_costs(hlo_text: str) -> tuple[int, int]:
    """(flops, bytes accessed) of an HLO module's text, counted like XLA's HloCostAnalysis."""
    flops = nbytes = 0
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        result, opcode, rest = m.groups()
        out = _SHAPE.findall(result)
        if not out or opcode in _FREE:
            continue
        out_elems = sum(_elements(d) for _, d in out)
        operands = _SHAPE.findall(rest.split("),", 1)[0])
        nbytes += sum(_elements(d) * _BYTES.get(t, 4) for t, d in out + operands)
        if opcode == "dot" and len(operands) >= 2:
            lhs = [int(x) for x in filter(None, operands[0][1].split(","))]
            dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
            k = 1
            for i in filter(None, (dims.group(1) if dims else "").split(",")):
                k *= lhs[int(i)]
            flops += 2 * out_elems * k
        elif opcode == "convolution" and len(operands) >= 2:
            kernel = _elements(operands[1][1])
            dims = re.search(r"dim_labels=\w+_(\w+)->", rest)
            out_features = 1
            if dims:
                kshape = [int(x) for x in filter(None, operands[1][1].split(","))]
                pos = dims.group(1).find("o")
                out_features = kshape[pos] if 0 <= pos < len(kshape) else 1
            flops += 2 * out_elems * (kernel // max(out_features, 1))
        elif opcode in ("reduce", "reduce-window"):
            flops += sum(_elements(d) for _, d in operands[: max(1, len(operands) // 2)])
        elif opcode in _ELEMENTWISE:
            flops += out_elems
    return flops, nbytes


# -- CPU flops -------------------------------------------------------------------------------

def cpu_flops(model, names, batch_of, renamed) -> dict[str, int]:
    """TensorFlow's registered flop count of each function's own ops (callees not included).

    ``renamed``: the Trial's registered copies (rebuilding a graph needs its callees defined).
    """
    import tensorflow as tf
    from tensorflow.python.framework import function_def_to_graph, ops
    from tensorflow.python.util import deprecation

    out = {}
    for name in names:
        fdef = model.functions[name]
        shapes = []
        for i, arg in enumerate(fdef.signature.input_arg):
            shape = arg_shape(fdef, i)
            if arg.type == DT_RESOURCE or shape is None:
                shapes.append(None)
            else:
                b = batch_of(name)
                shapes.append(tf.TensorShape([b if k == 0 and d is None else (1 if d is None else d)
                                              for k, d in enumerate(shape)]))
        total = 0
        try:
            graph = function_def_to_graph.function_def_to_graph(renamed[name], input_shapes=shapes)
        except Exception:  # a function TF cannot rebuild alone: no CPU cost known for it
            out[name] = 0
            continue
        b = batch_of(name)
        saved = {n.name: n.attr["_output_shapes"].list.shape for n in fdef.node_def if "_output_shapes" in n.attr}
        for arg, shape in zip(fdef.signature.input_arg, shapes):
            if shape is not None:
                saved.setdefault(arg.name, None)
        for op in graph.get_operations():  # the saved _output_shapes, batch dim made concrete
            for tensor, shape in zip(op.outputs, saved.get(op.name) or []):
                if not shape.unknown_rank:
                    dims = [b if k == 0 and d.size < 0 else (1 if d.size < 0 else d.size)
                            for k, d in enumerate(shape.dim)]
                    try:
                        tensor.set_shape(dims)
                    except ValueError:
                        pass
        for i, arg in enumerate(fdef.signature.input_arg):
            if shapes[i] is not None:
                try:
                    graph.get_operation_by_name(arg.name).outputs[0].set_shape(shapes[i])
                except (KeyError, ValueError):
                    pass
        with deprecation.silence():  # the flop registry calls a TF1 helper that logs a deprecation notice
            for op in graph.get_operations():
                try:
                    stat = ops.get_stats_for_node_def(graph, op.node_def, "flops")
                except (ValueError, TypeError, tf.errors.OpError):
                    continue
                total += int(stat.value or 0)
        out[name] = total
    return out


def cpu_functions(model, accelerator) -> list[str]:
    """Functions the signatures run outside the accelerator functions (the CPU part)."""
    seen, todo = set(), []
    for key in model.signatures:
        todo.append(signature_wrapper(model, key))
    while todo:
        name = todo.pop()
        if name in seen or name in accelerator:
            continue
        seen.add(name)
        todo.extend(callees(model, name))
    return sorted(seen)
