"""The compiled delegate: float32 partitions run as pre-packed NumPy chains.

The reference interpreter re-validates every operand, re-derives geometry and allocates
fresh arrays on every node of every invoke. This delegate does that work once per input
shape: it claims float32 nodes *at the op versions it knows* (the operator-versioning
guide's rule — a version it has not seen may mean features it does not implement), packs
weights once (FULLY_CONNECTED weights transposed, convolution filters laid out as im2col
matrices), plans a persistent buffer for every tensor internal to a partition, and runs the
partition as a flat list of closures that write into those buffers with ``out=`` and clamp
fused activations in place.

Ops without a specialised lowering here (softmax, pooling, means...) run their reference
kernel inside the chain, so a partition never has to return to the interpreter for them.
Tensors that leave a partition get fresh arrays on every invoke, so nothing the interpreter
(or a WHILE loop carrying values between iterations) holds is ever overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

import numpy as np

from .. import ops
from ..errors import KilnError, OpError, UnsupportedError
from ..ir import Operator
from ..ops.elementwise import activation_range, is_quantized
from ..ops.hotpath import clip
from ..ops.windowed import window_geometry
from ..ops.record import KernelCall
from ..ops.tables import OpTable
from ..runtime.delegate import DelegateKernel, NodeInfo, Partition, ReportingDelegate
from ..schema import Activation, DType

F32 = np.dtype(np.float32)

_FC_ACTIVATIONS = (Activation.NONE, Activation.RELU, Activation.RELU6, Activation.RELU_N1_TO_1)
#: Element budget of one im2col matrix; bigger convolutions run in chunks of output rows.
IM2COL_BUDGET = 1 << 24


def why_not(node: NodeInfo, allowed: frozenset[str]) -> str | None:
    """None if the delegate can run ``node``, else the reason it refuses it."""
    op = node.op
    name = node.name
    if op.op_type == "CUSTOM" or name not in allowed:
        return f"{name} is not an op this delegate runs"
    support = COMPILED_LOWERINGS[name]
    known = support.versions
    if node.version not in known:
        return f"{name} version {node.version} is unknown to the delegate (knows {sorted(known)})"
    reg = node.registration
    if reg is None or getattr(reg, "record", None) is None or reg.kernel is None:
        return f"{name} is overridden by a Python registration"
    consts = support.const_operands
    required = 2 if name in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D") else 1
    if len(op.inputs) < required or any(op.inputs[k] is None for k in range(required)) or not op.outputs:
        return f"{name} has {len(op.inputs)} inputs and {len(op.outputs)} outputs; the delegate needs more"
    for k, t in enumerate(op.inputs):
        if t is None:
            continue
        if k in consts:
            if not t.is_constant:
                return f"{name} operand {k} ({t.name!r}) is not a constant"
            if is_quantized(t):
                return f"{name} operand {k} ({t.name!r}) is quantized"
            continue
        if t.dtype != DType.FLOAT32 or t.quantization is not None and not t.quantization.is_empty:
            return f"{name} operand {k} ({t.name!r}) is {t.dtype.name}, not plain float32"
    for t in op.outputs:
        if t is not None and t.dtype != DType.FLOAT32:
            return f"{name} output {t.name!r} is {t.dtype.name}, not float32"
    if name in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D") and op.inputs[1].dtype != DType.FLOAT32:
        return f"{name} weights are {op.inputs[1].dtype.name} (hybrid), not float32"
    if name == "FULLY_CONNECTED":
        opts = op.options
        if opts["weights_format"] != 0:
            return "FULLY_CONNECTED with shuffled weights"
        if opts["fused_activation_function"] not in _FC_ACTIVATIONS:
            return "FULLY_CONNECTED with an activation LiteRT does not fuse there"
    if name == "CONV_2D":
        x, w = op.inputs[0], op.inputs[1]
        if len(x.shape) == 4 and len(w.shape) == 4 and x.shape[3] != w.shape[3]:
            return "grouped CONV_2D"
    return None


# -- compilation -------------------------------------------------------------------------------

@dataclass
class _Node:
    """One node as a lowering sees it: options, operand shapes / constants, slots."""

    op: Operator
    opts: SimpleNamespace
    label: str
    in_shapes: list[tuple | None]
    consts: list[np.ndarray | None]
    in_slots: list[int]      # -1 for constants and omitted operands
    out_slots: list[int]
    fresh: list[bool]        # output leaves the partition: give it a new array every invoke

    def error(self, message: str) -> OpError:
        return OpError(f"{self.label}: {message}")

    def output(self, k: int, shape) -> Callable[[], np.ndarray]:
        """A getter for output ``k``'s buffer: persistent if internal, fresh if it escapes."""
        shape = tuple(int(d) for d in shape)
        if self.fresh[k]:
            return lambda: np.empty(shape, F32)
        buf = np.empty(shape, F32)
        return lambda: buf


Step = Callable[[list], None]
Lowering = Callable[[_Node], tuple[Step, list[tuple]]]


def _operand(node: _Node, k: int):
    """(slot, constant) of operand k: exactly one of them is meaningful."""
    return node.in_slots[k], (node.consts[k] if k < len(node.consts) else None)


def _lower_fully_connected(node: _Node):
    x_shape = node.in_shapes[0]
    w = np.asarray(node.consts[1], F32)
    units, depth = w.shape
    size = int(np.prod(x_shape)) if x_shape else 1
    if depth == 0 or size % depth or (node.opts.keep_num_dims and x_shape[-1] != depth):
        raise node.error(f"input {list(x_shape)} does not fit weights {list(w.shape)}")
    rows = size // depth
    out_shape = (*x_shape[:-1], units) if node.opts.keep_num_dims else (rows, units)
    w_t = np.ascontiguousarray(w.T)  # packed once: [depth, units]
    bias = node.consts[2] if len(node.consts) > 2 and node.consts[2] is not None else None
    bias = None if bias is None else np.asarray(bias, F32).reshape(units)
    lo, hi = activation_range(node.opts.fused_activation_function, F32)
    get = node.output(0, (rows, units))
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        y = get()
        np.dot(slots[xi].reshape(rows, depth), w_t, out=y)
        if bias is not None:
            y += bias
        clip(y, lo, hi, out=y)
        slots[oi] = y.reshape(out_shape)

    return run, [out_shape]


class _Im2col:
    """A persistent zero-padded copy of the input and a precomputed window view over it.

    ``fill(x)`` copies x into the padded interior (the border stays zero) and gathers the
    windows of output rows [r0, r0 + rows) into a persistent column matrix.
    """

    def __init__(self, x_shape, khw, out_hw, pads, strides, dilation, chunk_rows):
        n, h, w, c = x_shape
        (kh, kw), (oh, ow) = khw, out_hw
        (pt, pb), (pl, pr) = pads
        self.padded = np.zeros((n, h + pt + pb, w + pl + pr, c), F32)
        self.interior = self.padded[:, pt:pt + h, pl:pl + w, :]
        sn, sh_, sw_, sc = self.padded.strides
        (sh, sw), (dh, dw) = strides, dilation
        self.windows = np.lib.stride_tricks.as_strided(
            self.padded, shape=(n, oh, ow, kh, kw, c),
            strides=(sn, sh_ * sh, sw_ * sw, sh_ * dh, sw_ * dw, sc), writeable=False)
        #: The same windows tap-major: [KH, KW, N, OH, OW, C].
        self.taps = np.lib.stride_tricks.as_strided(
            self.padded, shape=(kh, kw, n, oh, ow, c),
            strides=(sh_ * dh, sw_ * dw, sn, sh_ * sh, sw_ * sw, sc), writeable=False)
        self.rows = chunk_rows
        self.cols = np.empty((n, chunk_rows, ow, kh, kw, c), F32)
        self.n, self.oh, self.ow, self.k, self.c = n, oh, ow, kh * kw, c

    def load(self, x):
        np.copyto(self.interior, x)

    def gather(self, r0: int) -> np.ndarray:
        """Column matrix [n * rows * ow, kh * kw, c] of output rows r0.. (a view of a buffer)."""
        rows = min(self.rows, self.oh - r0)
        cols = self.cols[:, :rows]
        np.copyto(cols, self.windows[:, r0:r0 + rows])
        return cols.reshape(self.n * rows * self.ow, self.k, self.c)


def _conv_setup(node: _Node, w_khw):
    x_shape = node.in_shapes[0]
    if len(x_shape) != 4:
        raise node.error(f"input must be 4-D NHWC, got {list(x_shape)}")
    dil = (node.opts.dilation_h_factor, node.opts.dilation_w_factor)
    try:
        (oh, ow), pads = window_geometry(node.opts, x_shape[1:3], w_khw, dil)
    except OpError as exc:
        raise node.error(str(exc)) from None
    return x_shape, dil, (oh, ow), pads


def _chunk_rows(n, ow, oh, per_pixel) -> int:
    return max(1, min(oh, IM2COL_BUDGET // max(1, n * ow * per_pixel)))


def _lower_conv(node: _Node):
    w = np.asarray(node.consts[1], F32)
    cout, kh, kw, cin = w.shape
    x_shape, dil, (oh, ow), pads = _conv_setup(node, (kh, kw))
    n = x_shape[0]
    if x_shape[3] != cin:
        raise node.error(f"input channels {x_shape[3]} != filter channels {cin}")
    bias = node.consts[2] if len(node.consts) > 2 else None
    bias = None if bias is None else np.asarray(bias, F32).reshape(cout)
    lo, hi = activation_range(node.opts.fused_activation_function, F32)
    out_shape = (n, oh, ow, cout)
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    strides = (node.opts.stride_h, node.opts.stride_w)
    w_mat = np.ascontiguousarray(w.reshape(cout, kh * kw * cin).T)  # packed once: [K, cout]

    if kh == kw == 1 and pads == ((0, 0), (0, 0)):
        sh, sw = strides
        rows = n * oh * ow
        if sh == sw == 1 and not node.fresh[0]:  # the common case, with every view made once
            y = np.empty(out_shape, F32)
            y2 = y.reshape(rows, cout)
            x2_shape = (rows, cin)

            def run(slots):
                np.dot(slots[xi].reshape(x2_shape), w_mat, out=y2)
                if bias is not None:
                    np.add(y2, bias, out=y2)
                clip(y2, lo, hi, out=y2)
                slots[oi] = y
            return run, [out_shape]

        def run(slots):
            x = slots[xi]
            if sh != 1 or sw != 1:
                x = x[:, ::sh, ::sw, :][:, :oh, :ow]
            y = get()
            np.dot(x.reshape(-1, cin), w_mat, out=y.reshape(-1, cout))
            if bias is not None:
                y += bias
            clip(y, lo, hi, out=y)
            slots[oi] = y
        return run, [out_shape]

    depth = kh * kw * cin
    rows = _chunk_rows(n, ow, oh, depth)
    im = _Im2col(x_shape, (kh, kw), (oh, ow), pads, strides, dil, rows)

    def run(slots):
        im.load(slots[xi])
        y = get()
        if rows >= oh:  # one GEMM straight into the output buffer
            cols = im.gather(0)
            np.dot(cols.reshape(len(cols), depth), w_mat, out=y.reshape(-1, cout))
        else:
            for r0 in range(0, oh, rows):
                cols = im.gather(r0)
                y[:, r0:r0 + rows] = (cols.reshape(len(cols), depth) @ w_mat).reshape(n, -1, ow, cout)
        if bias is not None:
            y += bias
        clip(y, lo, hi, out=y)
        slots[oi] = y

    return run, [out_shape]


#: Element budget of a depthwise partial-products buffer [KH*KW + 1, N, OH, OW, C].
DEPTHWISE_BUDGET = 1 << 20


def _lower_depthwise(node: _Node):
    w = np.asarray(node.consts[1], F32)
    _, kh, kw, cout = w.shape
    x_shape, dil, (oh, ow), pads = _conv_setup(node, (kh, kw))
    n, cin = x_shape[0], x_shape[3]
    if w.shape[0] != 1 or cin == 0 or cout % cin:
        raise node.error(f"filter {list(w.shape)} does not fit {cin} input channels")
    mult = cout // cin
    bias = node.consts[2] if len(node.consts) > 2 else None
    bias = None if bias is None else np.asarray(bias, F32).reshape(cout)
    lo, hi = activation_range(node.opts.fused_activation_function, F32)
    out_shape = (n, oh, ow, cout)
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    strides = (node.opts.stride_h, node.opts.stride_w)
    k = kh * kw
    if mult == 1 and (k + 1) * n * oh * ow * cout <= DEPTHWISE_BUDGET:
        return _lower_depthwise_rows(node, w, bias, (lo, hi), out_shape, pads, strides, dil), [out_shape]
    taps = np.ascontiguousarray(w.reshape(k, cin, mult))  # packed once
    rows = _chunk_rows(n, ow, oh, k * cin)
    im = _Im2col(x_shape, (kh, kw), (oh, ow), pads, strides, dil, rows)

    def run(slots):
        im.load(slots[xi])
        y = get()
        if rows >= oh:  # per-channel dot products over the taps, into the output buffer
            np.einsum("mkc,kcd->mcd", im.gather(0), taps, out=y.reshape(-1, cin, mult))
        else:
            for r0 in range(0, oh, rows):
                part = np.einsum("mkc,kcd->mcd", im.gather(r0), taps)
                y[:, r0:r0 + rows] = part.reshape(n, -1, ow, cout)
        if bias is not None:
            y += bias
        clip(y, lo, hi, out=y)
        slots[oi] = y

    return run, [out_shape]


def _lower_depthwise_rows(node: _Node, w, bias, bounds, out_shape, pads, strides, dil):
    """Depthwise without a channel multiplier: all taps' products in one buffer, then one sum.

    Rows 0..K-1 of the buffer receive each tap's window times its weights; row K holds the
    bias, written once. Summing over the rows adds them one after the other, so the result
    is the reference kernel's: taps in order, then the bias.
    """
    n, oh, ow, c = out_shape
    _, kh, kw, _ = w.shape
    k = kh * kw
    im = _Im2col(node.in_shapes[0], (kh, kw), (oh, ow), pads, strides, dil, 1)
    rows = np.zeros((k + (bias is not None), n, oh, ow, c), F32)
    products = rows[:k]
    gathered = products.reshape(kh, kw, n, oh, ow, c)
    weights = np.ascontiguousarray(np.broadcast_to(w.reshape(k, 1, 1, 1, c), products.shape))
    if bias is not None:
        rows[k] = bias
    lo, hi = bounds
    get = node.output(0, out_shape)
    xi, oi = node.in_slots[0], node.out_slots[0]
    taps = im.taps

    def run(slots):
        im.load(slots[xi])
        np.copyto(gathered, taps)
        np.multiply(products, weights, out=products)
        y = get()
        np.add.reduce(rows, axis=0, out=y)
        clip(y, lo, hi, out=y)
        slots[oi] = y

    return run


_BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}


def _lower_binary(node: _Node):
    ufunc = _BINARY[node.op.op_type]
    (sa, ca), (sb, cb) = _operand(node, 0), _operand(node, 1)
    try:
        out_shape = np.broadcast_shapes(node.in_shapes[0], node.in_shapes[1])
    except ValueError:
        raise node.error(f"shapes {list(node.in_shapes[0])} and {list(node.in_shapes[1])} do not "
                         "broadcast") from None
    lo, hi = activation_range(node.opts.fused_activation_function, F32)
    ca = None if ca is None else np.asarray(ca, F32)
    cb = None if cb is None else np.asarray(cb, F32)
    get = node.output(0, out_shape)
    oi = node.out_slots[0]

    def run(slots):
        y = get()
        ufunc(slots[sa] if ca is None else ca, slots[sb] if cb is None else cb, out=y)
        clip(y, lo, hi, out=y)
        slots[oi] = y

    return run, [out_shape]


def _reference_call(node: _Node) -> tuple[Callable, KernelCall]:
    record = ops.require(node.op.op_type)
    call = KernelCall(node.opts, node.op, [F32 for _ in node.op.outputs])
    return record.kernel, call


def _probe(node: _Node, kernel, call) -> list[np.ndarray]:
    """Run the reference kernel once on zeros to learn the output shapes."""
    args = []
    for shape, const in zip(node.in_shapes, node.consts):
        if const is not None:
            args.append(const)
        elif shape is None:
            args.append(None)
        else:
            args.append(np.zeros(shape, F32))
    with np.errstate(all="ignore"):
        result = kernel(call, *args)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _lower_view(node: _Node):
    """RESHAPE / SQUEEZE / EXPAND_DIMS: the shape is known at compile time; run = a view."""
    kernel, call = _reference_call(node)
    (probe,) = _probe(node, kernel, call)
    shape = probe.shape
    xi, oi, fresh = node.in_slots[0], node.out_slots[0], node.fresh[0]

    def run(slots):
        y = slots[xi].reshape(shape)
        slots[oi] = y.copy() if fresh else y

    return run, [shape]


def _lower_reference(node: _Node):
    """Any other claimed op: its reference kernel, called straight from the chain."""
    kernel, call = _reference_call(node)
    shapes = [r.shape for r in _probe(node, kernel, call)]
    slots_in = node.in_slots
    consts = node.consts
    pairs = [(s, c) for s, c in zip(slots_in, consts)]
    outs = list(zip(node.out_slots, node.fresh))

    def run(slots):
        args = [c if c is not None else (slots[s] if s >= 0 else None) for s, c in pairs]
        result = kernel(call, *args)
        if not isinstance(result, (tuple, list)):
            result = (result,)
        for (oi, fresh), value in zip(outs, result):
            value = np.asarray(value, F32)
            if fresh and not value.flags.owndata:
                value = value.copy()
            slots[oi] = value

    return run, shapes


def _lower_mean(node: _Node):
    """MEAN over constant axes: a float64 sum divided into the output buffer (as the kernel)."""
    kernel, call = _reference_call(node)
    (probe,) = _probe(node, kernel, call)
    rank = len(node.in_shapes[0])
    axes = tuple(sorted({int(a) % rank for a in np.asarray(node.consts[1]).reshape(-1)})) if rank else ()
    count = int(np.prod([node.in_shapes[0][a] for a in axes], dtype=np.int64))
    keep = bool(node.opts.keep_dims)
    if count == 0 or np.sum(np.zeros(node.in_shapes[0]), axis=axes, keepdims=keep).shape != probe.shape:
        return _lower_reference(node)  # empty or unusual reductions: the kernel's own rules
    get = node.output(0, probe.shape)
    xi, oi = node.in_slots[0], node.out_slots[0]

    def run(slots):
        y = get()
        np.divide(np.sum(slots[xi], axis=axes, dtype=np.float64, keepdims=keep), count, out=y, casting="unsafe")
        slots[oi] = y

    return run, [probe.shape]


@dataclass(frozen=True)
class CompiledSupport:
    """What the delegate knows of one op: the versions it claims (higher versions add integer,
    hybrid or sparse variants, op_version.cc, that the chains do not implement), operand
    positions that must be constant so the chain packs them at prepare time, and its lowering
    (None: the reference kernel runs inside the chain)."""

    versions: frozenset[int]
    const_operands: tuple[int, ...] = ()
    lower: Lowering | None = None


#: The compiled delegate's per-op support: an open table, so a new lowering registers here
#: (for an op that has a record) instead of in a side table of its own.
COMPILED_LOWERINGS: OpTable[CompiledSupport] = OpTable("compiled delegate")


def _register(names: Iterable[str], versions: Iterable[int] = (1,), const_operands: tuple[int, ...] = (),
              lower: Lowering | None = None) -> None:
    for name in names:
        COMPILED_LOWERINGS.register(name, CompiledSupport(frozenset(versions), const_operands, lower))


_register(["FULLY_CONNECTED"], (1, 5, 6), (1, 2), _lower_fully_connected)  # plain, keep_num_dims, no bias
_register(["CONV_2D"], (1,), (1, 2), _lower_conv)
_register(["DEPTHWISE_CONV_2D"], (1, 2), (1, 2), _lower_depthwise)  # 2: dilation
_register(["ADD", "SUB", "MUL"], lower=_lower_binary)
_register(["RESHAPE", "EXPAND_DIMS"], const_operands=(1,), lower=_lower_view)
_register(["SQUEEZE"], lower=_lower_view)
_register(["MEAN"], const_operands=(1,), lower=_lower_mean)
_register(["TRANSPOSE"], const_operands=(1,))
_register(["RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH", "GELU", "SOFTMAX",
           "AVERAGE_POOL_2D", "MAX_POOL_2D", "CONCATENATION", "BATCH_MATMUL", "SQUARED_DIFFERENCE",
           "RSQRT", "NEG"])


class _SupportedVersions(Mapping):
    """Read-only ``op name -> versions`` view of COMPILED_LOWERINGS (kept for callers)."""

    def __getitem__(self, name: str) -> frozenset[int]:
        if name not in COMPILED_LOWERINGS:
            raise KeyError(name)
        return COMPILED_LOWERINGS[name].versions

    def __iter__(self):
        return iter(COMPILED_LOWERINGS)

    def __len__(self) -> int:
        return len(COMPILED_LOWERINGS)


#: The op versions the delegate knows, per op.
SUPPORTED_VERSIONS: Mapping[str, frozenset[int]] = _SupportedVersions()


class _Plan:
    """A partition compiled for one set of input shapes."""

    def __init__(self, steps: list[Step], n_slots: int, out_slots: list[int]):
        self.steps = steps
        self.n_slots = n_slots
        self.out_slots = out_slots


class ChainKernel(DelegateKernel):
    """A claimed partition: compiled per input-shape signature, then a flat list of closures."""

    MAX_PLANS = 8

    def __init__(self, delegate: "CompiledDelegate", partition: Partition):
        self.delegate = delegate
        self.partition = partition
        self.nodes = partition.nodes
        self.plans: dict[tuple, _Plan] = {}
        slot: dict[int, int] = {}
        for t in partition.inputs:
            slot[id(t)] = len(slot)
        for info in self.nodes:
            for t in info.op.outputs:
                if t is not None:
                    slot[id(t)] = len(slot)
        self.slot = slot
        self.escaping = {id(t) for t in partition.outputs}
        self.out_slots = [slot[id(t)] for t in partition.outputs]

    def _compile(self, shapes: tuple) -> _Plan:
        known: dict[int, tuple] = {i: s for i, s in enumerate(shapes)}
        steps = []
        for info in self.nodes:
            op = info.op
            label = f"{self.delegate.name} delegate, node {info.index} ({info.name})"
            in_slots, consts, in_shapes = [], [], []
            for t in op.inputs:
                if t is None:
                    in_slots.append(-1), consts.append(None), in_shapes.append(None)
                elif t.is_constant:
                    in_slots.append(-1), consts.append(t.data), in_shapes.append(tuple(t.data.shape))
                else:
                    s = self.slot[id(t)]
                    if s not in known:
                        raise OpError(f"{label}: reads {t.name!r} before the partition computes it")
                    in_slots.append(s), consts.append(None), in_shapes.append(known[s])
            node = _Node(op, ops.require(op.op_type).make_options(op.options), label, in_shapes, consts,
                         in_slots, [-1 if t is None else self.slot[id(t)] for t in op.outputs],
                         [t is not None and id(t) in self.escaping for t in op.outputs])
            lower = COMPILED_LOWERINGS[op.op_type].lower or _lower_reference
            try:
                run, out_shapes = lower(node)
            except KilnError:
                raise
            except Exception as exc:  # a shape the lowering cannot handle: say where
                raise OpError(f"{label}: cannot compile for input shapes {in_shapes}: "
                              f"{type(exc).__name__}: {exc}") from exc
            for s, shape in zip(node.out_slots, out_shapes):
                if s >= 0:
                    known[s] = tuple(shape)
            steps.append(run)
        return _Plan(steps, len(self.slot), self.out_slots)

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        key = tuple([np.shape(x) for x in inputs])
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= self.MAX_PLANS:
                self.plans.pop(next(iter(self.plans)))
            plan = self.plans[key] = self._compile(key)
        slots = [x if x.dtype == F32 else np.asarray(x, F32) for x in inputs]
        slots.extend([None] * (plan.n_slots - len(slots)))
        for run in plan.steps:
            run(slots)
        return [slots[s] for s in plan.out_slots]


class CompiledDelegate(ReportingDelegate):
    """Claims float32 nodes at known versions; runs each partition as a compiled chain.

    Args:
      ops: restrict the delegate to these op names (default: every op in COMPILED_LOWERINGS).

    After an interpreter prepares, ``claimed`` lists (node index, op name, version) of the
    nodes the delegate took and ``rejected`` maps refused nodes to the reason.
    """

    name = "compiled"

    def __init__(self, ops: Iterable[str] | None = None):
        chosen = frozenset(COMPILED_LOWERINGS if ops is None else ops)
        unknown = chosen - COMPILED_LOWERINGS.keys()
        if unknown:
            raise UnsupportedError(f"the compiled delegate has no lowering for {sorted(unknown)}; "
                                   f"it runs {sorted(COMPILED_LOWERINGS)}")
        super().__init__()
        self.ops = chosen

    def why_not(self, node: NodeInfo) -> str | None:
        return why_not(node, self.ops)

    def make_kernel(self, partition: Partition) -> ChainKernel:
        return ChainKernel(self, partition)
