"""Float one-op .tflite models for every op whose record says how it is quantized.

Issue #21 asks that every op kiln's quantizer can make integer runs, once quantized, in kiln's
Interpreter and in LiteRT's reference kernels with equal results. The list of ops is not
written here: `one_op_models` walks ``kiln.ops.OPS`` and takes every record with a
``quantization`` trait, so an op that gains a trait without a builder below fails the sweep's
coverage test (tests/quant/test_one_op_conformance.py) instead of being skipped. An op that
cannot stand alone as a model must be named in `NOT_STANDALONE` with the reason.

Each `OneOpModel` is one (op, option variant): realistic shapes, its constant operands (axes,
permutations, paddings, sizes, weights of at least `WEIGHT_ELEMENTS` elements, so dynamic-range
quantization takes them) and how its float inputs are drawn, which gives both the
representative dataset and held-out inputs. Models are written by kiln's IR and writer
(tests/harness.py `single_op_model`), float32 throughout, as a converter would hand them to a
quantizer.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kiln import ops
from kiln.schema import Activation, Padding
from tests.harness import Const, Var, single_op_model

NONE, RELU, RELU6, TANH = Activation.NONE, Activation.RELU, Activation.RELU6, Activation.TANH
#: Weights at least this large (kiln.quant.weights.MIN_WEIGHT_ELEMENTS, TF's default), so the
#: dynamic-range mode quantizes them.
WEIGHT_ELEMENTS = 1024
#: Samples in the representative dataset, and held-out inputs the interpreters are compared on.
CALIBRATION_SAMPLES, HELD_OUT_SAMPLES = 16, 3


@dataclass(frozen=True)
class Drawn:
    """A float model input: its shape and the interval its values are drawn from."""

    shape: tuple[int, ...]
    low: float = -3.0
    high: float = 3.0

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high, self.shape).astype(np.float32)


@dataclass(frozen=True)
class OneOpModel:
    """One op with one set of options, as a float model with its input distributions.

    ``operands``: the op's inputs in order — `Drawn` (a model input), harness `Const` / `Var`
    (a constant / a variable tensor), or None (an omitted optional operand).
    """

    op: str
    variant: str
    operands: tuple = ()
    options: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.op}-{self.variant}"

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    @functools.cached_property
    def float_model(self) -> bytes:
        rng = np.random.default_rng(self.seed)
        inputs = [o.draw(rng) if isinstance(o, Drawn) else o for o in self.operands]
        return single_op_model(self.op, inputs, options=dict(self.options))

    def samples(self, count: int, seed: int) -> list[list[np.ndarray]]:
        """``count`` feeds (one array per model input), drawn with ``seed``."""
        rng = np.random.default_rng([self.seed, seed])
        drawn = [o for o in self.operands if isinstance(o, Drawn)]
        return [[o.draw(rng) for o in drawn] for _ in range(count)]

    def representative_dataset(self) -> list[list[np.ndarray]]:
        return self.samples(CALIBRATION_SAMPLES, 0)

    def held_out(self) -> list[list[np.ndarray]]:
        return self.samples(HELD_OUT_SAMPLES, 1)


#: Ops with a quantization trait that cannot be built as a one-op model, and why.
NOT_STANDALONE: dict[str, str] = {}

#: op name -> f(rng, op name) giving its variants.
_BUILDERS: dict[str, Callable[[np.random.Generator, str], list[OneOpModel]]] = {}


def builds(*op_names: str):
    """Register the function giving an op's variants."""
    def register(fn):
        for name in op_names:
            _BUILDERS[name] = fn
        return fn
    return register


def quantized_ops() -> list[str]:
    """Every op whose record has a quantization trait, by name."""
    return sorted(name for name, record in ops.OPS.items() if record.quantization is not None)


@functools.lru_cache(maxsize=None)
def one_op_models() -> tuple[OneOpModel, ...]:
    """Every (op, variant) of every quantizable op (`quantized_ops`) that has a builder."""
    models = []
    for name in quantized_ops():
        if name in NOT_STANDALONE:
            continue
        if name not in _BUILDERS:
            continue  # the coverage test names it
        models.extend(_BUILDERS[name](np.random.default_rng(zlib.crc32(name.encode())), name))
    return tuple(models)


def unbuilt_ops() -> list[str]:
    """Quantizable ops with neither a builder nor a `NOT_STANDALONE` reason."""
    return [n for n in quantized_ops() if n not in _BUILDERS and n not in NOT_STANDALONE]


def by_name() -> dict[str, OneOpModel]:
    return {m.name: m for m in one_op_models()}


# -- operand helpers ---------------------------------------------------------------------------

def i32(*values) -> Const:
    return Const(np.asarray(values, np.int32))


def scalar(value, dtype=np.int32) -> Const:
    """A 0-D constant, as TF's converter writes axes and pad values."""
    return Const(np.asarray(value, dtype))


def weights(rng, *shape, scale=None) -> Const:
    """Glorot-like float weights."""
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    scale = scale if scale is not None else 1.0 / np.sqrt(fan_in)
    return Const((rng.standard_normal(shape) * scale).astype(np.float32))


def bias(rng, n, scale=0.3) -> Const:
    return Const((rng.standard_normal(n) * scale).astype(np.float32))


IMAGE = (2, 9, 10, 8)   # batch, height, width, channels: odd sizes make SAME padding uneven


# -- elementwise, one input ---------------------------------------------------------------------

@builds("ABS", "RELU", "RELU6", "RELU_N1_TO_1", "TANH", "LOGISTIC", "EXP", "ELU", "HARD_SWISH")
def _unary(rng, name):
    low, high = {"EXP": (-4.0, 2.0), "RELU6": (-3.0, 9.0), "LOGISTIC": (-6.0, 6.0),
                 "HARD_SWISH": (-5.0, 5.0)}.get(name, (-3.0, 3.0))
    return [OneOpModel(name, "image", (Drawn(IMAGE, low, high),)),
            OneOpModel(name, "matrix", (Drawn((4, 37), low / 2, high),))]


@builds("LOG", "SQRT", "RSQRT")
def _positive_unary(rng, name):
    return [OneOpModel(name, "positive", (Drawn(IMAGE, 0.05, 8.0),))]


@builds("GELU")
def _gelu(rng, name):
    return [OneOpModel("GELU", f"approximate_{a}", (Drawn((3, 5, 48), -4, 4),), {"approximate": a})
            for a in (False, True)]


@builds("LEAKY_RELU")
def _leaky_relu(rng, name):
    return [OneOpModel("LEAKY_RELU", f"alpha_{a}", (Drawn(IMAGE),), {"alpha": a}) for a in (0.2, 0.01)]


@builds("PRELU")
def _prelu(rng, name):
    per_channel = Const(rng.uniform(0.05, 0.4, (1, 1, IMAGE[3])).astype(np.float32))
    full = Const(rng.uniform(-0.3, 0.5, IMAGE[1:]).astype(np.float32))
    return [OneOpModel("PRELU", "shared_spatial_alpha", (Drawn(IMAGE), per_channel)),
            OneOpModel("PRELU", "full_alpha", (Drawn(IMAGE), full))]


@builds("SOFTMAX")
def _softmax(rng, name):
    return [OneOpModel("SOFTMAX", f"beta_{b}", (Drawn((4, 3, 20), -5, 5),), {"beta": b}) for b in (1.0, 0.5)]


@builds("LOG_SOFTMAX")
def _log_softmax(rng, name):
    return [OneOpModel("LOG_SOFTMAX", "last_axis", (Drawn((6, 20), -5, 5),))]


@builds("L2_NORMALIZATION")
def _l2_norm(rng, name):
    return [OneOpModel("L2_NORMALIZATION", "last_axis", (Drawn((3, 5, 32)),))]


# -- elementwise, two inputs --------------------------------------------------------------------

@builds("ADD", "SUB", "MUL")
def _arithmetic(rng, name):
    full = (2, 6, 7, 16)
    return [OneOpModel(name, "same_shape", (Drawn(full), Drawn(full, -1, 5)), {"fused_activation_function": NONE}),
            OneOpModel(name, "broadcast_relu", (Drawn(full), Drawn((1, 1, 7, 16), -2, 2)),
                       {"fused_activation_function": RELU}),
            OneOpModel(name, "constant_rhs_relu6", (Drawn(full), Const(rng.uniform(-1.5, 2.5, (16,)).astype(np.float32))),
                       {"fused_activation_function": RELU6})]


@builds("MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
def _binary(rng, name):
    shape = (3, 8, 12)
    return [OneOpModel(name, "same_shape", (Drawn(shape), Drawn(shape, -1, 4))),
            OneOpModel(name, "broadcast", (Drawn(shape), Drawn((1, 12), -2, 2))),
            OneOpModel(name, "constant_scalar", (Drawn(shape), Const(np.array([0.75], np.float32))))]


# -- weighted ops -------------------------------------------------------------------------------

@builds("FULLY_CONNECTED")
def _fully_connected(rng, name):
    w = weights(rng, 40, 64)
    return [OneOpModel("FULLY_CONNECTED", "relu", (Drawn((5, 64)), w, bias(rng, 40)),
                       {"fused_activation_function": RELU}),
            OneOpModel("FULLY_CONNECTED", "keep_num_dims", (Drawn((2, 3, 64)), w, bias(rng, 40)),
                       {"keep_num_dims": True}),
            OneOpModel("FULLY_CONNECTED", "flatten_3d_relu6", (Drawn((2, 3, 64)), w, bias(rng, 40)),
                       {"fused_activation_function": RELU6}),
            OneOpModel("FULLY_CONNECTED", "no_bias", (Drawn((4, 64)), w, None))]


def _conv_options(padding, stride, dilation=1, act=NONE, **extra):
    return dict(padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dilation,
                dilation_w_factor=dilation, fused_activation_function=act, **extra)


@builds("CONV_2D")
def _conv(rng, name):
    w = weights(rng, 16, 3, 3, IMAGE[3])          # 1152 elements
    return [OneOpModel("CONV_2D", "same_s1_relu", (Drawn(IMAGE), w, bias(rng, 16)), _conv_options(Padding.SAME, 1, act=RELU)),
            OneOpModel("CONV_2D", "valid_s2", (Drawn(IMAGE), w, bias(rng, 16)), _conv_options(Padding.VALID, 2)),
            # after a ReLU: the input zero point is -128, which SAME padding must use
            OneOpModel("CONV_2D", "same_s2_nonnegative_input", (Drawn(IMAGE, 0, 6), w, bias(rng, 16)),
                       _conv_options(Padding.SAME, 2)),
            OneOpModel("CONV_2D", "same_dilated_relu6", (Drawn(IMAGE), w, bias(rng, 16)),
                       _conv_options(Padding.SAME, 1, 2, RELU6)),
            # two operands, as LiteRT's CONV_2D reads a bias wherever a third operand is listed
            OneOpModel("CONV_2D", "no_bias_s2", (Drawn(IMAGE), w), _conv_options(Padding.SAME, 2))]


@builds("DEPTHWISE_CONV_2D")
def _depthwise(rng, name):
    x = (1, 8, 9, 64)
    w1 = weights(rng, 1, 3, 3, 128, scale=0.3)   # multiplier 2: 1152 elements
    w2 = weights(rng, 1, 5, 5, 64, scale=0.2)    # multiplier 1: 1600 elements
    return [OneOpModel("DEPTHWISE_CONV_2D", "m2_same_relu6", (Drawn(x), w1, bias(rng, 128)),
                       _conv_options(Padding.SAME, 1, act=RELU6, depth_multiplier=2)),
            OneOpModel("DEPTHWISE_CONV_2D", "m1_valid_s2", (Drawn(x), w2, bias(rng, 64)),
                       _conv_options(Padding.VALID, 2, depth_multiplier=1)),
            OneOpModel("DEPTHWISE_CONV_2D", "m1_same_nonnegative_input", (Drawn(x, 0, 6), w2, bias(rng, 64)),
                       _conv_options(Padding.SAME, 1, depth_multiplier=1)),
            OneOpModel("DEPTHWISE_CONV_2D", "m2_same_dilated", (Drawn(x), w1, bias(rng, 128)),
                       _conv_options(Padding.SAME, 1, 2, RELU, depth_multiplier=2)),
            OneOpModel("DEPTHWISE_CONV_2D", "m1_no_bias", (Drawn(x), w2), _conv_options(Padding.SAME, 1, depth_multiplier=1))]


@builds("TRANSPOSE_CONV")
def _transpose_conv(rng, name):
    x = (1, 5, 6, 16)
    w = weights(rng, 8, 3, 3, 16)                # 1152 elements
    options = lambda padding, stride: dict(padding=padding, stride_h=stride, stride_w=stride)
    return [OneOpModel("TRANSPOSE_CONV", "same_s2", (i32(1, 10, 12, 8), w, Drawn(x), bias(rng, 8)),
                       options(Padding.SAME, 2)),
            OneOpModel("TRANSPOSE_CONV", "valid_s1_no_bias", (i32(1, 7, 8, 8), w, Drawn(x), None),
                       options(Padding.VALID, 1)),
            OneOpModel("TRANSPOSE_CONV", "valid_s2", (i32(1, 11, 13, 8), w, Drawn(x), bias(rng, 8)),
                       options(Padding.VALID, 2))]


@builds("BATCH_MATMUL")
def _batch_matmul(rng, name):
    return [OneOpModel("BATCH_MATMUL", "two_inputs", (Drawn((2, 5, 24)), Drawn((2, 24, 7), -1, 1))),
            OneOpModel("BATCH_MATMUL", "adj_x_broadcast", (Drawn((3, 24, 5)), Drawn((24, 9), -1, 1)), {"adj_x": True}),
            OneOpModel("BATCH_MATMUL", "rank4_broadcast_adj_y", (Drawn((2, 1, 5, 16)), Drawn((3, 7, 16), -1, 1)),
                       {"adj_y": True}),
            OneOpModel("BATCH_MATMUL", "constant_rhs_adj_y", (Drawn((2, 6, 64)), weights(rng, 32, 64)),
                       {"adj_y": True})]


def _lstm_weights(rng, n_input, n_cell):
    """Operands 1-17 of one LSTM direction as Keras builds it: four gates, no peephole or
    projection; each gate matrix has n_cell × n_input (≥ WEIGHT_ELEMENTS) elements."""
    gates_in = [weights(rng, n_cell, n_input) for _ in range(4)]
    gates_rec = [weights(rng, n_cell, n_cell) for _ in range(4)]
    biases = [bias(rng, n_cell, 0.1) for _ in range(4)]
    biases[1] = Const(np.ones(n_cell, np.float32))   # Keras' unit forget bias
    return gates_in + gates_rec + [None, None, None] + biases + [None, None]


@builds("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _lstm(rng, name):
    batch, time, n = 2, 6, 32
    def model(variant, time_major):
        x = (time, batch, n) if time_major else (batch, time, n)
        operands = ((Drawn(x, -1, 1),) + tuple(_lstm_weights(rng, n, n))
                    + (Var(np.zeros((batch, n), np.float32)), Var(np.zeros((batch, n), np.float32)))
                    + (None,) * 4)
        return OneOpModel("UNIDIRECTIONAL_SEQUENCE_LSTM", variant, operands,
                          {"fused_activation_function": TANH, "cell_clip": 10.0, "time_major": time_major})
    return [model("keras", False), model("time_major", True)]


@builds("BIDIRECTIONAL_SEQUENCE_LSTM")
def _bidirectional_lstm(rng, name):
    batch, time, n = 2, 5, 32
    def model(variant, merge):
        states = tuple(Var(np.zeros((batch, n), np.float32)) for _ in range(4))
        operands = ((Drawn((time, batch, n), -1, 1),) + tuple(_lstm_weights(rng, n, n)) + tuple(_lstm_weights(rng, n, n))
                    + states + (None,) * 9)
        return OneOpModel("BIDIRECTIONAL_SEQUENCE_LSTM", variant, operands,
                          {"fused_activation_function": TANH, "merge_outputs": merge, "time_major": True})
    return [model("merged", True), model("separate", False)]


# -- pooling, reductions ------------------------------------------------------------------------

@builds("AVERAGE_POOL_2D", "MAX_POOL_2D")
def _pool(rng, name):
    def pool(padding, size, stride, act=NONE):
        return dict(padding=padding, filter_height=size, filter_width=size, stride_h=stride, stride_w=stride,
                    fused_activation_function=act)
    return [OneOpModel(name, "2x2_s2_valid", (Drawn(IMAGE),), pool(Padding.VALID, 2, 2)),
            OneOpModel(name, "3x3_s1_same_relu6", (Drawn(IMAGE),), pool(Padding.SAME, 3, 1, RELU6)),
            OneOpModel(name, "3x3_s2_same_nonnegative_input", (Drawn(IMAGE, 0, 6),), pool(Padding.SAME, 3, 2))]


@builds("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN")
def _reduce(rng, name):
    return [OneOpModel(name, "spatial_keep_dims", (Drawn(IMAGE), i32(1, 2)), {"keep_dims": True}),
            OneOpModel(name, "last_axis", (Drawn((4, 6, 20)), i32(-1)), {"keep_dims": False}),
            OneOpModel(name, "axis1_no_keep_dims", (Drawn(IMAGE, -1, 5), i32(1)), {"keep_dims": False})]


# -- moving values ------------------------------------------------------------------------------

@builds("CONCATENATION")
def _concatenation(rng, name):
    return [OneOpModel("CONCATENATION", "channels", (Drawn(IMAGE), Drawn(IMAGE[:3] + (5,), -1, 6)), {"axis": 3}),
            OneOpModel("CONCATENATION", "three_inputs_axis1",
                       (Drawn((3, 4, 6)), Drawn((3, 2, 6), -8, 2), Drawn((3, 5, 6), -0.5, 0.5)), {"axis": 1})]


@builds("PACK")
def _pack(rng, name):
    shape = (4, 10)
    return [OneOpModel("PACK", "axis0", (Drawn(shape), Drawn(shape, -1, 5)), {"values_count": 2, "axis": 0}),
            OneOpModel("PACK", "three_axis_last", (Drawn(shape), Drawn(shape, -6, 1), Drawn(shape, -2, 2)),
                       {"values_count": 3, "axis": 2})]


@builds("RESHAPE")
def _reshape(rng, name):
    return [OneOpModel("RESHAPE", "shape_operand", (Drawn(IMAGE), i32(2, -1, 8))),
            OneOpModel("RESHAPE", "flatten", (Drawn(IMAGE), i32(2, 720)), {"new_shape": (2, 720)})]


@builds("SQUEEZE")
def _squeeze(rng, name):
    return [OneOpModel("SQUEEZE", "axes", (Drawn((2, 1, 7, 1, 5)),), {"squeeze_dims": (1, 3)})]


@builds("EXPAND_DIMS")
def _expand_dims(rng, name):
    return [OneOpModel("EXPAND_DIMS", "axis1", (Drawn((4, 9, 5)), scalar(1)))]


@builds("TRANSPOSE")
def _transpose(rng, name):
    return [OneOpModel("TRANSPOSE", "nhwc_to_nchw", (Drawn(IMAGE), i32(0, 3, 1, 2))),
            OneOpModel("TRANSPOSE", "rank3", (Drawn((4, 6, 5)), i32(2, 0, 1)))]


@builds("GATHER")
def _gather(rng, name):
    return [OneOpModel("GATHER", "axis0", (Drawn((20, 12)), i32(3, 0, 19, 7, 7, 11)), {"axis": 0}),
            OneOpModel("GATHER", "axis1_2d_indices", (Drawn((4, 15, 6)), Const(np.array([[1, 14], [0, 5]], np.int32))),
                       {"axis": 1})]


@builds("SLICE")
def _slice(rng, name):
    return [OneOpModel("SLICE", "image", (Drawn(IMAGE), i32(0, 2, 1, 3), i32(2, 5, -1, 4)))]


@builds("STRIDED_SLICE")
def _strided_slice(rng, name):
    return [OneOpModel("STRIDED_SLICE", "strides", (Drawn(IMAGE), i32(0, 1, 0, 1), i32(2, 9, 10, 8), i32(1, 2, 3, 2))),
            OneOpModel("STRIDED_SLICE", "masks_shrink", (Drawn((5, 8, 6)), i32(2, 1, 0), i32(3, -1, 0), i32(1, 1, 1)),
                       {"shrink_axis_mask": 1, "end_mask": 4, "begin_mask": 4}),
            OneOpModel("STRIDED_SLICE", "negative_stride", (Drawn((6, 10)), i32(5, 8), i32(0, 1), i32(-2, -3)))]


@builds("PAD")
def _pad(rng, name):
    return [OneOpModel("PAD", "image", (Drawn(IMAGE), Const(np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32)))),
            OneOpModel("PAD", "nonnegative_input", (Drawn(IMAGE, 0, 6), Const(np.array([[0, 0], [2, 2], [1, 1], [0, 0]], np.int32)))),
            OneOpModel("PAD", "rank2", (Drawn((5, 7)), Const(np.array([[3, 0], [1, 1]], np.int32))))]


@builds("PADV2")
def _padv2(rng, name):
    return [OneOpModel("PADV2", "constant_value", (Drawn(IMAGE), Const(np.array([[0, 0], [1, 1], [2, 0], [0, 0]], np.int32)),
                                                   scalar(0.5, np.float32)))]


@builds("TILE")
def _tile(rng, name):
    return [OneOpModel("TILE", "multiples", (Drawn((2, 3, 5)), i32(2, 1, 3)))]


@builds("BROADCAST_TO")
def _broadcast_to(rng, name):
    return [OneOpModel("BROADCAST_TO", "rank_up", (Drawn((1, 7, 1)), i32(3, 4, 7, 5)))]


@builds("REVERSE_V2")
def _reverse(rng, name):
    return [OneOpModel("REVERSE_V2", "axis1", (Drawn(IMAGE), i32(1))),
            OneOpModel("REVERSE_V2", "last_axis", (Drawn((6, 11)), i32(1)))]


@builds("SPLIT")
def _split(rng, name):
    return [OneOpModel("SPLIT", "channels_in_4", (scalar(3), Drawn(IMAGE)), {"num_splits": 4})]


@builds("SPLIT_V")
def _split_v(rng, name):
    return [OneOpModel("SPLIT_V", "uneven", (Drawn((4, 12, 5)), i32(3, 7, 2), scalar(1)), {"num_splits": 3})]


@builds("DEPTH_TO_SPACE")
def _depth_to_space(rng, name):
    return [OneOpModel("DEPTH_TO_SPACE", "block2", (Drawn((2, 4, 5, 12)),), {"block_size": 2})]


@builds("SPACE_TO_DEPTH")
def _space_to_depth(rng, name):
    return [OneOpModel("SPACE_TO_DEPTH", "block2", (Drawn((2, 6, 8, 3)),), {"block_size": 2})]


@builds("SPACE_TO_BATCH_ND")
def _space_to_batch(rng, name):
    return [OneOpModel("SPACE_TO_BATCH_ND", "block2_padded",
                       (Drawn((1, 7, 8, 4)), i32(2, 2), Const(np.array([[1, 0], [0, 0]], np.int32)))),
            OneOpModel("SPACE_TO_BATCH_ND", "nonnegative_input",
                       (Drawn((2, 5, 6, 3), 0, 6), i32(2, 2), Const(np.array([[1, 0], [1, 1]], np.int32))))]


@builds("BATCH_TO_SPACE_ND")
def _batch_to_space(rng, name):
    return [OneOpModel("BATCH_TO_SPACE_ND", "block2_cropped",
                       (Drawn((4, 4, 4, 3)), i32(2, 2), Const(np.array([[1, 0], [0, 1]], np.int32))))]


@builds("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(rng, name):
    x = (1, 5, 7, 6)
    return [OneOpModel(name, "upscale", (Drawn(x), i32(10, 13))),
            OneOpModel(name, "align_corners", (Drawn(x), i32(9, 11)), {"align_corners": True}),
            OneOpModel(name, "half_pixel_centers_downscale", (Drawn(x), i32(3, 4)), {"half_pixel_centers": True})]
