"""The op sweep: one-op `tf.function`s for every TensorFlow op that TF 2.21's converter lowers
to LiteRT builtins, as data — each converted by TF's converter and by kiln, run in LiteRT and
kiln, compared with TF eager (tests/converter/test_op_sweep*.py, test_op_fuzz.py).

`TF_LEGALIZED` is the list of TF op types TF's converter legalizes, read from TF's sources
(facts, not code; the files are named in `SOURCES`). Every op in it has a `Case` here
(`Case.ops` names the ops its graph holds: the fast lane checks them) or an `EXCLUDED` entry
with the reason. `KNOWN_GAPS` names the cases kiln does not convert yet: a strict xfail, so a
gap that closes fails until it leaves the set.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

#: Where `TF_LEGALIZED` comes from (tensorflow/tensorflow, read for TF 2.21's converter).
SOURCES = (
    "tensorflow/compiler/mlir/lite/transforms/legalize_patterns.td: one Pat per TF op -> TFL op",
    "tensorflow/compiler/mlir/lite/transforms/legalize_tf.cc: ConcatV2, MatMul, BatchMatMul*, MatrixDiagV2/V3, "
    "Pack, Split, SplitV, Unpack, Conv3D, Conv3DBackpropInputV2, Assert; explicit broadcasting of binary ops",
    "tensorflow/compiler/mlir/lite/transforms/prepare_patterns.td and prepare_tf.cc: BatchNormWithGlobalNormalization,"
    " FusedBatchNorm*, Conv2D, DepthwiseConv2dNative, Einsum, StridedSlice, RFFT (-> RFFT2D), MatrixSetDiagV2/V3, "
    "TensorScatterAdd, identity-like ops (CheckNumerics, Snapshot, StopGradient, PreventGradient, IdentityN, ...)",
    "tensorflow/compiler/mlir/tensorflow/transforms/lower_tf.td and lower_tf.cc (TF::PopulateLoweringTFPatterns, "
    "applied by legalize_tf.cc): IsNan, IsInf, IsFinite, TruncateDiv, Lgamma, Roll, TensorScatterUpdate, Selu, "
    "Expm1, Xdivy, Xlogy, Xlog1py, DivNoNan, MulNoNan, Size, Inv, Reciprocal, Rint, the *Grad ops, "
    "(Sparse)SoftmaxCrossEntropyWithLogits, DynamicStitch, InvertPermutation, Empty, ...",
    "tensorflow/compiler/mlir/lite/transforms/lower_static_tensor_list.cc: the TensorList ops",
    "tensorflow/compiler/mlir/lite/transforms/legalize_variables.td, legalize_hashtables.cc: resource variables "
    "and hash tables; legalize_tf_while.cc and the functional-op passes: While, If, Case",
    "tensorflow/compiler/mlir/lite/ir/tfl_ops.td: the TFL ops (LiteRT builtins) they become",
)


#: TF op type -> the source file (short name) whose pattern lowers it toward TFLite builtins.
TF_LEGALIZED: dict[str, str] = {
    **dict.fromkeys((
        "Abs", "AddN", "AvgPool", "ArgMax", "ArgMin", "BroadcastTo", "Ceil", "Cos", "Elu", "ExpandDims",
        "FakeQuantWithMinMaxArgs", "Fill", "Floor", "LeakyRelu", "Log", "Log1p", "LogicalNot", "LogSoftmax",
        "MaxPool", "Maximum", "Minimum", "Neg", "OneHot", "Pow", "Range", "Relu6", "Relu", "ReverseSequence",
        "Round", "Rsqrt", "Sqrt", "Square", "SegmentSum", "UnsortedSegmentSum", "UnsortedSegmentMax",
        "UnsortedSegmentMin", "UnsortedSegmentProd", "Select", "SelectV2", "Shape", "Sigmoid", "Sin", "Slice",
        "Softmax", "Softplus", "Squeeze", "Tanh", "Transpose", "Where", "ZerosLike", "BroadcastArgs", "Less",
        "Greater", "LessEqual", "GreaterEqual", "Gather", "GatherNd", "GatherV2", "FloorDiv", "NotEqual",
        "LogicalAnd", "LogicalOr", "Add", "AddV2", "BiasAdd", "Sub", "Mul", "RealDiv", "Div", "BatchMatMul",
        "BatchMatMulV2", "BatchMatMulV3", "FakeQuantWithMinMaxVars", "QuantizeAndDequantizeV4", "Rank",
        "SquaredDifference", "ReverseV2", "Equal", "Pad", "Tile", "PadV2", "Mean", "Sum", "TopKV2", "ApproxTopK",
        "Min", "Max", "Prod", "Any", "All", "Cast", "BatchToSpaceND", "SpaceToBatchND", "SpaceToDepth",
        "DepthToSpace", "ResizeBilinear", "ResizeNearestNeighbor", "MirrorPad", "SparseToDense", "Unique",
        "FloorMod", "Exp", "LRN", "NonMaxSuppressionV4", "NonMaxSuppressionV5", "MatrixDiag",
        "Conv2DBackpropInput", "MatrixSetDiagV3", "ScatterNd", "Cumsum", "Reshape", "StridedSlice", "RFFT2D",
        "Complex", "ComplexAbs", "Real", "Imag", "Bucketize", "RandomUniform", "RandomStandardNormal",
        "Multinomial", "XlaDynamicUpdateSlice", "Atan2", "Sign", "Bitcast", "BitwiseXor", "RightShift",
        "SigmoidGrad"), "legalize_patterns.td"),
    **dict.fromkeys((
        "Assert", "ConcatV2", "MatMul", "MatrixDiagV2", "MatrixDiagV3", "Pack", "Split", "SplitV", "Unpack",
        "Conv3D", "Conv3DBackpropInputV2"), "legalize_tf.cc"),
    **dict.fromkeys((
        "BatchNormWithGlobalNormalization", "CheckNumerics", "Snapshot", "StopGradient", "PlaceholderWithDefault",
        "PreventGradient", "XlaSharding", "IdentityN", "Identity", "MatrixSetDiag", "MatrixSetDiagV2",
        "TensorScatterAdd"), "prepare_patterns.td"),
    **dict.fromkeys((
        "Conv2D", "DepthwiseConv2dNative", "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "Einsum",
        "RFFT"), "prepare_tf.cc"),
    **dict.fromkeys((
        "BiasAddGrad", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits", "Dequantize",
        "DivNoNan", "MulNoNan", "TruncateDiv", "Empty", "Inv", "IsInf", "IsNan", "IsFinite", "L2Loss", "Reciprocal",
        "Rint", "RsqrtGrad", "Size", "SqrtGrad", "TanhGrad", "OnesLike", "Xdivy", "Xlogy", "Xlog1py",
        "TensorScatterUpdate", "Selu", "SeluGrad", "Expm1"), "lower_tf.td"),
    **dict.fromkeys((
        "DynamicStitch", "InvertPermutation", "Lgamma", "Roll", "SparseMatMul", "NonMaxSuppressionV3",
        "MatrixBandPart"), "lower_tf.cc"),
    **dict.fromkeys((
        "EmptyTensorList", "TensorListFromTensor", "TensorListGetItem", "TensorListLength", "TensorListPushBack",
        "TensorListReserve", "TensorListSetItem", "TensorListStack", "TensorListResize", "TensorListConcatV2",
        "TensorListElementShape", "TensorListGather"), "lower_static_tensor_list.cc"),
    **dict.fromkeys(("VarHandleOp", "ReadVariableOp", "AssignVariableOp"), "legalize_variables.td"),
    **dict.fromkeys(("HashTableV2", "LookupTableFindV2", "LookupTableImportV2", "LookupTableSizeV2"),
                    "legalize_hashtables.cc"),
    **dict.fromkeys(("While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall"),
                    "legalize_tf_while.cc, the functional-op passes"),
}

#: TF ops of `TF_LEGALIZED` with no sweep case, and why.
EXCLUDED: dict[str, str] = {
    **dict.fromkeys(("FakeQuantWithMinMaxArgs", "FakeQuantWithMinMaxVars", "QuantizeAndDequantizeV4", "Dequantize"),
                    "quantization-only: quantization-aware-training graphs, which TF turns into QUANTIZE/DEQUANTIZE "
                    "pairs; kiln quantizes after training (kiln.quantize, tests/quant) and converts no QAT graph"),
    **dict.fromkeys(("VarHandleOp", "ReadVariableOp", "AssignVariableOp"),
                    "needs a resource variable (a tf.Module's state): covered against TF's file by "
                    "tests/converter/test_zoo.py (sm_variables)"),
    **dict.fromkeys(("HashTableV2", "LookupTableImportV2", "LookupTableSizeV2"),
                    "a hash table's: TF 2.21's converter refuses hash tables with builtins only (the "
                    "hash_table_lookup case shows it; its legalization runs only with Select TF ops)"),
    "StatefulPartitionedCall": "a call of a stateful function: inlined like PartitionedCall (case partitioned_call); "
                               "the stateful calls are the variable models of tests/converter/test_zoo.py",
    "XlaSharding": "not in tf.raw_ops of TF 2.21 (an XLA-internal annotation a tf.function cannot build)",
    "BatchNormWithGlobalNormalization": "removed from TensorFlow's GraphDef at version 9: TF 2.21 cannot trace it",
}

#: Cases kiln does not convert yet (strict: a case that converts fails until it leaves the set).
KNOWN_GAPS: frozenset[str] = frozenset()

#: Cases where kiln writes more ops than TF's file, because TF's file is wrong: case -> (extra
#: ops allowed, why). LiteRT's NON_MAX_SUPPRESSION_V4 / V5 always return max_output_size
#: entries (zeros after the selected ones); TF returns only the selected ones unless padding is
#: asked for, and TF's converted file returns the padded ones (a detector's count read as 20 where
#: TF says 12). kiln slices each output to the count (one RESHAPE, one SLICE per output).
EXTRA_OPS: dict[str, tuple[int, str]] = {
    "nms_v3": (2, "TF's file returns max_output_size padded indices; kiln slices them to the count"),
    "nms_v4": (2, "TF's file returns max_output_size padded indices; kiln slices them to the count"),
    "nms_v4_none_kept": (2, "TF's file returns max_output_size padded indices; kiln slices them to the count"),
    "nms_v5": (3, "TF's file returns max_output_size padded indices and scores; kiln slices them to the count"),
}


@dataclass(frozen=True)
class In:
    """One input: shape, dtype, how its values are made (`VALUES`), and whether the fuzz
    test gives it each other dtype (False for indices, shapes, booleans, boxes...)."""

    shape: tuple
    dtype: str = "float32"
    values: str = "normal"
    fuzz: bool = True


@dataclass(frozen=True)
class Case:
    """One sweep case: ``build(tf)`` returns the function of the inputs; ``ops`` are the TF op
    types of the traced graph it covers; ``random``: compare shape, dtype and distribution
    ("uniform", "normal", "categorical", "dropout", "uniform_sum3") instead of values."""

    name: str
    ops: tuple[str, ...]
    build: Callable
    inputs: tuple[In, ...]
    random: str | None = None
    tol: float = 1e-4
    #: Why TF 2.21's converter refuses this case itself (Select TF ops needed), though its op is in
    #: `TF_LEGALIZED`: not a sweep case then; the slow lane checks that TF still refuses it.
    tf_refuses: str = ""


def f32(*shape, v="normal"):
    return In(tuple(shape), "float32", v)


def i32(*shape, v="int", fuzz=True):
    return In(tuple(shape), "int32", v, fuzz)


def i64(*shape, v="int", fuzz=True):
    return In(tuple(shape), "int64", v, fuzz)


def b(*shape):
    return In(tuple(shape), "bool", "bool", False)


def idx(*shape, n, dtype="int32"):
    """Indices in [0, n)."""
    return In(tuple(shape), dtype, f"index:{n}", False)


#: Float values with TensorFlow's awkward ones in place: NaN, ±inf, ±0 and halfway ties.
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -7.25], np.float64)


def make_values(spec: In, dtype: str | None = None, seed: int = 0) -> np.ndarray:
    """The input ``spec`` describes, in ``dtype`` (the fuzz test's) or its own."""
    dtype = dtype or spec.dtype
    rng = np.random.default_rng(seed + sum(map(ord, spec.values)))
    shape, kind = spec.shape, spec.values
    n = int(np.prod(shape)) if shape else 1
    np_type = np.dtype(dtype) if dtype != "string" else None
    if kind == "permutation":
        return rng.permutation(n).reshape(shape).astype(dtype)
    if kind.startswith("index:"):
        return rng.integers(0, int(kind.split(":")[1]), size=shape).astype(dtype)
    if kind == "true":
        return np.ones(shape, bool)
    if dtype == "bool" or kind == "bool":
        return rng.random(shape) > 0.5
    if dtype == "string":
        return np.array([b"ab", b"c", b"", b"kiln"] * n, dtype=object)[:n].reshape(shape)
    if np_type.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np_type.kind in "iu":    # small integers, negative ones where the type has them
        values = rng.integers(-7, 8, size=shape)
        if kind in ("nonzero", "positive"):
            values = np.where(values == 0, 3, values)
        return (np.abs(values) if np_type.kind == "u" or kind == "positive" else values).astype(dtype)
    if kind == "special":
        values = rng.standard_normal(n) * 2
        values[: min(n, SPECIAL.size)] = SPECIAL[: min(n, SPECIAL.size)]
        return values.reshape(shape).astype(dtype)
    if kind == "ties":          # finite: ±0, halfway ties and large values, no NaN / inf
        values = rng.standard_normal(n) * 2
        finite = SPECIAL[3:]
        values[: min(n, finite.size)] = finite[: min(n, finite.size)]
        return values.reshape(shape).astype(dtype)
    if kind == "int":           # integer-valued floats (negative ones too)
        return rng.integers(-7, 8, size=shape).astype(dtype)
    if kind == "nonzero":
        return (rng.integers(1, 8, size=shape) * np.where(rng.random(shape) > 0.4, -1, 1)).astype(dtype)
    if kind == "positive":
        return rng.uniform(0.1, 3.0, size=shape).astype(dtype)
    if kind == "image":
        return rng.uniform(0.0, 1.0, size=shape).astype(dtype)
    if kind == "boxes":
        corner = rng.uniform(0, 1, size=shape[:-1] + (2,))
        return np.concatenate([corner, corner + rng.uniform(0.2, 0.6, size=shape[:-1] + (2,))], -1).astype(dtype)
    if kind == "zeros":
        return np.zeros(shape, dtype)
    if kind == "logits":
        return (rng.standard_normal(shape) * 2).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _cases(tf) -> list[Case]:
    """Every case; ``tf`` is TensorFlow (the lambdas close over it)."""
    raw = tf.raw_ops
    C = Case
    x24, x35, x45 = f32(2, 4), f32(3, 5), f32(4, 5)
    s24 = f32(2, 4, v="special")
    t24 = f32(2, 4, v="ties")
    p24 = f32(2, 4, v="positive")
    img = f32(1, 6, 6, 3, v="image")
    cases = [
        # -- element-wise unary math ---------------------------------------------------------
        C("abs", ("Abs",), lambda x: tf.abs(x), (s24,)),
        C("ceil", ("Ceil",), lambda x: tf.math.ceil(x), (s24,)),
        C("cos", ("Cos",), lambda x: tf.cos(x), (t24,)),
        C("sin", ("Sin",), lambda x: tf.sin(x), (t24,)),
        C("exp", ("Exp",), lambda x: tf.exp(x), (s24,)),
        C("expm1", ("Expm1",), lambda x: tf.math.expm1(x), (t24,)),
        C("floor", ("Floor",), lambda x: tf.floor(x), (s24,)),
        C("log", ("Log",), lambda x: tf.math.log(x), (p24,)),
        C("log1p", ("Log1p",), lambda x: tf.math.log1p(x), (p24,)),
        C("neg", ("Neg",), lambda x: tf.negative(x), (s24,)),
        C("reciprocal", ("Reciprocal",), lambda x: tf.math.reciprocal(x), (f32(2, 4, v="nonzero"),)),
        C("inv", ("Inv",), lambda x: raw.Inv(x=x), (f32(2, 4, v="nonzero"),)),
        C("round", ("Round",), lambda x: tf.round(x), (t24,)),
        C("rint", ("Rint",), lambda x: tf.math.rint(x), (t24,)),
        C("rsqrt", ("Rsqrt",), lambda x: tf.math.rsqrt(x), (p24,)),
        C("sqrt", ("Sqrt",), lambda x: tf.sqrt(x), (p24,)),
        C("square", ("Square",), lambda x: tf.square(x), (s24,)),
        C("sign", ("Sign",), lambda x: tf.sign(x), (s24,)),
        C("tanh", ("Tanh",), lambda x: tf.tanh(x), (s24,)),
        C("sigmoid", ("Sigmoid",), lambda x: tf.sigmoid(x), (t24,)),
        C("relu", ("Relu",), lambda x: tf.nn.relu(x), (s24,)),
        C("relu_int", ("Relu",), lambda x: tf.nn.relu(x), (i32(2, 4),)),
        C("relu_int64", ("Relu",), lambda x: tf.nn.relu(x), (i64(2, 4),)),
        C("relu6", ("Relu6",), lambda x: tf.nn.relu6(x), (t24,)),
        C("leaky_relu", ("LeakyRelu",), lambda x: tf.nn.leaky_relu(x, 0.3), (t24,)),
        C("elu", ("Elu",), lambda x: tf.nn.elu(x), (t24,)),
        C("selu", ("Selu",), lambda x: tf.nn.selu(x), (t24,)),
        C("softplus", ("Softplus",), lambda x: tf.nn.softplus(x), (t24,)),
        C("softmax", ("Softmax",), lambda x: tf.nn.softmax(x), (x24,)),
        C("log_softmax", ("LogSoftmax",), lambda x: tf.nn.log_softmax(x), (x24,)),
        C("logical_not", ("LogicalNot",), lambda x: tf.logical_not(x), (b(2, 4),)),
        C("zeros_like", ("ZerosLike",), lambda x: raw.ZerosLike(x=x), (x24,)),
        C("zeros_like_dynamic", ("ZerosLike",), lambda x: raw.ZerosLike(x=x), (In((None, 4)),)),
        C("ones_like", ("OnesLike",), lambda x: raw.OnesLike(x=x), (x24,)),
        C("ones_like_dynamic", ("OnesLike",), lambda x: raw.OnesLike(x=x), (In((None, 4)),)),
        C("is_nan", ("IsNan",), lambda x: tf.math.is_nan(x), (s24,)),
        C("is_inf", ("IsInf",), lambda x: tf.math.is_inf(x), (s24,)),
        C("is_finite", ("IsFinite",), lambda x: tf.math.is_finite(x), (s24,)),
        C("lgamma", ("Lgamma",), lambda x: tf.math.lgamma(x), (f32(2, 4, v="positive"),), tol=1e-3),
        # -- element-wise binary math ---------------------------------------------------------
        C("add", ("AddV2",), lambda x, y: x + y, (s24, x24)),
        C("add_broadcast", ("AddV2",), lambda x, y: x + y, (f32(2, 1, 4), f32(3, 1))),
        C("add_raw", ("Add",), lambda x, y: raw.Add(x=x, y=y), (x24, x24)),
        C("add_n", ("AddN",), lambda x, y: tf.add_n([x, y, x]), (x24, x24)),
        C("sub", ("Sub",), lambda x, y: x - y, (s24, x24)),
        C("mul", ("Mul",), lambda x, y: x * y, (s24, x24)),
        C("real_div", ("RealDiv",), lambda x, y: x / y, (x24, f32(2, 4, v="nonzero"))),
        C("div", ("Div",), lambda x, y: raw.Div(x=x, y=y), (x24, f32(2, 4, v="nonzero"))),
        C("div_int", ("Div",), lambda x, y: raw.Div(x=x, y=y), (i32(2, 4), i32(2, 4, v="nonzero"))),
        C("div_no_nan", ("DivNoNan",), lambda x, y: tf.math.divide_no_nan(x, y), (x24, f32(2, 4, v="int"))),
        C("mul_no_nan", ("MulNoNan",), lambda x, y: tf.math.multiply_no_nan(x, y), (s24, f32(2, 4, v="int"))),
        C("floor_div", ("FloorDiv",), lambda x, y: tf.math.floordiv(x, y), (i32(2, 4), i32(2, 4, v="nonzero"))),
        C("floor_div_float", ("FloorDiv",), lambda x, y: tf.math.floordiv(x, y), (t24, f32(2, 4, v="nonzero"))),
        C("floor_mod", ("FloorMod",), lambda x, y: tf.math.floormod(x, y), (i32(2, 4), i32(2, 4, v="nonzero"))),
        C("floor_mod_float", ("FloorMod",), lambda x, y: tf.math.floormod(x, y), (t24, f32(2, 4, v="nonzero"))),
        C("truncate_div", ("TruncateDiv",), lambda x, y: tf.truncatediv(x, y), (i32(2, 4), i32(2, 4, v="nonzero"))),
        C("maximum", ("Maximum",), lambda x, y: tf.maximum(x, y), (t24, x24)),
        C("minimum", ("Minimum",), lambda x, y: tf.minimum(x, y), (t24, x24)),
        C("pow", ("Pow",), lambda x, y: tf.pow(x, y), (p24, x24)),
        C("pow_int", ("Pow",), lambda x, y: tf.pow(x, y), (i32(2, 4), i32(2, 4, v="index:4"))),
        C("squared_difference", ("SquaredDifference",), lambda x, y: tf.math.squared_difference(x, y), (t24, x24)),
        C("atan2", ("Atan2",), lambda x, y: tf.math.atan2(x, y), (t24, x24)),
        C("xdivy", ("Xdivy",), lambda x, y: tf.math.xdivy(x, y), (f32(2, 4, v="int"), s24)),
        C("xlogy", ("Xlogy",), lambda x, y: tf.math.xlogy(x, y), (f32(2, 4, v="int"), s24)),
        C("xlog1py", ("Xlog1py",), lambda x, y: tf.math.xlog1py(x, y), (f32(2, 4, v="int"), s24)),
        C("bitwise_xor", ("BitwiseXor",), lambda x, y: tf.bitwise.bitwise_xor(x, y), (i32(2, 4), i32(2, 4))),
        C("right_shift", ("RightShift",), lambda x, y: tf.bitwise.right_shift(x, y),
          (i32(2, 4), i32(2, 4, v="index:4", fuzz=False))),
        C("less", ("Less",), lambda x, y: tf.less(x, y), (t24, t24)),
        C("less_equal", ("LessEqual",), lambda x, y: tf.less_equal(x, y), (t24, x24)),
        C("greater", ("Greater",), lambda x, y: tf.greater(x, y), (t24, x24)),
        C("greater_equal", ("GreaterEqual",), lambda x, y: tf.greater_equal(x, y), (t24, x24)),
        C("equal", ("Equal",), lambda x, y: tf.equal(x, y), (i32(2, 4), i32(2, 4))),
        C("not_equal", ("NotEqual",), lambda x, y: tf.not_equal(x, y), (i32(2, 4), i32(2, 4))),
        C("compare_broadcast", ("Less",), lambda x, y: tf.less(x, y), (f32(2, 1, 4), f32(3, 1))),
        C("logical_and", ("LogicalAnd",), lambda x, y: tf.logical_and(x, y), (b(2, 4), b(2, 4))),
        C("logical_or", ("LogicalOr",), lambda x, y: tf.logical_or(x, y), (b(2, 4), b(2, 4))),
        C("bias_add", ("BiasAdd",), lambda x: tf.nn.bias_add(x, tf.constant([1.0, -2.0, 0.5, 3.0])), (x24,)),
        C("bias_add_nchw", ("BiasAdd",),
          lambda x: tf.nn.bias_add(x, tf.constant([1.0, -2.0]), data_format="NCHW"), (f32(1, 2, 3, 3),)),
        C("clip_by_value", ("Maximum", "Minimum"), lambda x: tf.clip_by_value(x, -0.5, 0.7), (t24,)),
        # -- training-only ops TF still lowers ----------------------------------------------------
        C("sigmoid_grad", ("SigmoidGrad",), lambda y, dy: raw.SigmoidGrad(y=y, dy=dy), (x24, x24)),
        C("tanh_grad", ("TanhGrad",), lambda y, dy: raw.TanhGrad(y=y, dy=dy), (x24, x24)),
        C("rsqrt_grad", ("RsqrtGrad",), lambda y, dy: raw.RsqrtGrad(y=y, dy=dy), (p24, x24)),
        C("sqrt_grad", ("SqrtGrad",), lambda y, dy: raw.SqrtGrad(y=y, dy=dy), (p24, x24)),
        C("selu_grad", ("SeluGrad",), lambda g, y: raw.SeluGrad(gradients=g, outputs=y), (x24, x24)),
        C("bias_add_grad", ("BiasAddGrad",), lambda g: raw.BiasAddGrad(out_backprop=g), (x35,)),
        C("softmax_xent", ("SoftmaxCrossEntropyWithLogits",),
          lambda x: tf.nn.softmax_cross_entropy_with_logits(tf.constant([[0.1, 0.2, 0.3, 0.4]] * 2), x), (x24,)),
        C("sparse_softmax_xent", ("SparseSoftmaxCrossEntropyWithLogits",),
          lambda x: tf.nn.sparse_softmax_cross_entropy_with_logits(tf.constant([1, 3]), x), (x24,)),
        C("l2_loss", ("L2Loss",), lambda x: tf.nn.l2_loss(x), (x24,)),
        # -- reductions ---------------------------------------------------------------------------
        C("mean", ("Mean",), lambda x: tf.reduce_mean(x, 1), (x45,)),
        C("mean_keep", ("Mean",), lambda x: tf.reduce_mean(x, [0, 1], keepdims=True), (x45,)),
        C("sum", ("Sum",), lambda x: tf.reduce_sum(x, 0), (x45,)),
        C("sum_int", ("Sum",), lambda x: tf.reduce_sum(x, -1), (i32(3, 4),)),
        C("prod", ("Prod",), lambda x: tf.reduce_prod(x, 1), (x45,)),
        C("max", ("Max",), lambda x: tf.reduce_max(x, 1), (x45,)),
        C("min", ("Min",), lambda x: tf.reduce_min(x, [0, 1]), (x45,)),
        C("any", ("Any",), lambda x: tf.reduce_any(x, 1), (b(3, 4),)),
        C("all", ("All",), lambda x: tf.reduce_all(x, 0), (b(3, 4),)),
        C("arg_max", ("ArgMax",), lambda x: tf.argmax(x, 1), (x45,)),
        C("arg_min", ("ArgMin",), lambda x: tf.argmin(x, 0, output_type=tf.int32), (x45,)),
        C("cumsum", ("Cumsum",), lambda x: tf.cumsum(x, 1, exclusive=True, reverse=True), (x45,)),
        C("reduce_variance", ("Mean", "Square", "Sub"), lambda x: tf.math.reduce_variance(x, -1), (x45,)),
        C("reduce_std", ("Sqrt", "Square", "Sub"), lambda x: tf.math.reduce_std(x, 0), (x45,)),
        C("logsumexp", ("IsFinite", "Max"), lambda x: tf.reduce_logsumexp(x, -1), (x24,)),
        C("l2_normalize", ("Rsqrt", "Maximum", "Square"), lambda x: tf.math.l2_normalize(x, -1), (x24,)),
        # -- shapes ---------------------------------------------------------------------------------
        C("shape", ("Shape",), lambda x: raw.Shape(input=x), (x24,)),
        C("shape_dynamic", ("Shape",), lambda x: tf.shape(x) * 2, (In((None, 4)),)),
        C("size", ("Size",), lambda x: raw.Size(input=x), (x24,)),
        C("size_dynamic", ("Size",), lambda x: tf.size(x) + 1, (In((None, 4)),)),
        C("rank", ("Rank",), lambda x: raw.Rank(input=x), (x24,)),
        C("reshape", ("Reshape",), lambda x: tf.reshape(x, [4, 2]), (x24,)),
        C("reshape_dynamic", ("Reshape",), lambda x: tf.reshape(x, [-1]), (In((None, 4)),)),
        C("expand_dims", ("ExpandDims",), lambda x: tf.expand_dims(x, 1), (x24,)),
        C("squeeze", ("Squeeze",), lambda x: tf.squeeze(x, [1]), (f32(2, 1, 4),)),
        C("transpose", ("Transpose",), lambda x: tf.transpose(x, [2, 0, 1]), (f32(2, 3, 4),)),
        C("pack", ("Pack",), lambda x, y: tf.stack([x, y], 1), (x24, x24)),
        C("unpack", ("Unpack",), lambda x: tf.unstack(x, axis=1), (f32(2, 3),)),
        C("concat", ("ConcatV2",), lambda x, y: tf.concat([x, y], -1), (x24, f32(2, 3))),
        C("split", ("Split",), lambda x: tf.split(x, 2, axis=1), (x24,)),
        C("split_v", ("SplitV",), lambda x: tf.split(x, [1, 3], axis=1), (x24,)),
        C("slice", ("Slice",), lambda x: tf.slice(x, [1, 1], [2, 3]), (x45,)),
        C("strided_slice", ("StridedSlice",), lambda x: x[::-1, 1:4:2], (x45,)),
        C("strided_slice_masks", ("StridedSlice",), lambda x: x[..., tf.newaxis, 1], (f32(2, 3, 4),)),
        C("tile", ("Tile",), lambda x: tf.tile(x, [2, 3]), (f32(2, 3),)),
        C("fill", ("Fill",), lambda x: tf.fill(tf.shape(x), 2.5) + x, (In((None, 3)),)),
        C("empty", ("Empty",), lambda n: raw.Empty(shape=n, dtype=tf.float32, init=True) + 1.0,
          (i32(2, v="index:4", fuzz=False),)),
        C("broadcast_to", ("BroadcastTo",), lambda x: tf.broadcast_to(x, [3, 2, 4]), (f32(2, 1),)),
        C("broadcast_args", ("BroadcastArgs",),
          lambda s: raw.BroadcastArgs(s0=s, s1=tf.constant([3, 1], s.dtype)), (i32(1, v="index:3", fuzz=False),)),
        C("pad", ("Pad",), lambda x: tf.pad(x, [[1, 0], [0, 2]]), (x24,)),
        C("pad_v2", ("PadV2",), lambda x: tf.pad(x, [[1, 0], [0, 2]], constant_values=3.0), (x24,)),
        C("mirror_pad", ("MirrorPad",), lambda x: tf.pad(x, [[1, 1], [2, 0]], mode="REFLECT"), (x35,)),
        C("mirror_pad_symmetric", ("MirrorPad",), lambda x: tf.pad(x, [[1, 1], [0, 2]], mode="SYMMETRIC"), (x35,)),
        C("reverse", ("ReverseV2",), lambda x: tf.reverse(x, [1]), (x45,)),
        C("reverse_sequence", ("ReverseSequence",),
          lambda x: tf.reverse_sequence(x, tf.constant([1, 3, 5, 2]), seq_axis=1, batch_axis=0), (x45,)),
        C("range", ("Range",), lambda n: tf.range(0, n[0], 2), (i32(1, v="index:9", fuzz=False),)),
        C("range_float", ("Range",), lambda x: tf.range(x[0], 10.0, 1.5), (f32(1, v="int"),)),
        C("cast", ("Cast",), lambda x: tf.cast(x, tf.int32), (t24,)),
        C("cast_bool", ("Cast",), lambda x: tf.cast(x, tf.float32), (b(2, 4),)),
        C("bitcast", ("Bitcast",), lambda x: tf.bitcast(x, tf.int32), (x24,)),
        C("identity", ("Identity",), lambda x: tf.identity(x) * 2.0, (x24,)),
        C("identity_n", ("IdentityN",), lambda x, y: raw.IdentityN(input=[x * 2.0, y + 1.0]), (x24, x24)),
        C("stop_gradient", ("StopGradient",), lambda x: tf.stop_gradient(x) * 2.0, (x24,)),
        C("snapshot", ("Snapshot",), lambda x: raw.Snapshot(input=x) * 2.0, (x24,)),
        C("prevent_gradient", ("PreventGradient",), lambda x: raw.PreventGradient(input=x) * 2.0, (x24,)),
        C("check_numerics", ("CheckNumerics",), lambda x: tf.debugging.check_numerics(x, "bad") * 2.0, (x24,)),
        C("ensure_shape", ("EnsureShape",), lambda x: tf.ensure_shape(x, [None, 4]) * 2.0, (In((None, 4)),)),
        C("placeholder_with_default", ("PlaceholderWithDefault",),
          lambda x: tf.compat.v1.placeholder_with_default(x, [2, 4]) * 2.0, (x24,)),
        C("assert", ("Assert",), lambda x: _with_assert(tf, x), (x24,)),
        # -- indexing, scatter, gather --------------------------------------------------------------
        C("gather", ("GatherV2",), lambda x, i: tf.gather(x, i), (x45, idx(3, n=4))),
        C("gather_axis1", ("GatherV2",), lambda x, i: tf.gather(x, i, axis=1), (x45, idx(2, 2, n=5))),
        C("gather_batch_dims", ("GatherV2",), lambda x, i: tf.gather(x, i, axis=1, batch_dims=1),
          (x45, idx(4, 2, n=5))),
        C("gather_v1", ("Gather",), lambda x, i: raw.Gather(params=x, indices=i), (x45, idx(3, n=4))),
        C("gather_nd", ("GatherNd",), lambda x, i: tf.gather_nd(x, i), (x45, idx(3, 2, n=4))),
        C("scatter_nd", ("ScatterNd",), lambda u: tf.scatter_nd(tf.constant([[1], [3]]), u, [5, 3]), (f32(2, 3),)),
        C("tensor_scatter_update", ("TensorScatterUpdate",),
          lambda x, u: tf.tensor_scatter_nd_update(x, tf.constant([[1], [3]]), u), (x45, f32(2, 5))),
        C("tensor_scatter_add", ("TensorScatterAdd",),
          lambda x, u: tf.tensor_scatter_nd_add(x, tf.constant([[1], [3]]), u), (x45, f32(2, 5))),
        C("sparse_to_dense", ("SparseToDense",),
          lambda v: raw.SparseToDense(sparse_indices=tf.constant([[0], [2]]), output_shape=tf.constant([4]),
                                      sparse_values=v, default_value=tf.zeros([], v.dtype)), (f32(2),)),
        C("one_hot", ("OneHot",), lambda i: tf.one_hot(i, 5, 2.0, -1.0), (idx(4, n=5),)),
        C("where", ("Where",), lambda x: tf.where(x > 0.0), (x24,)),
        C("where_empty", ("Where",), lambda x: tf.where(x > 100.0), (x24,)),
        C("unique_of_nothing", ("Unique", "Where"), lambda x: tf.unique(tf.boolean_mask(x, x > 100.0))[0], (x24,)),
        C("gather_of_nothing", ("GatherV2", "Where"), lambda x: tf.gather(x, tf.where(x[:, 0] > 100.0)[:, 0]),
          (x24,)),
        C("select", ("Select",), lambda c, x, y: raw.Select(condition=c, x=x, y=y), (b(2, 4), x24, x24)),
        C("select_rows", ("Select",), lambda c, x, y: raw.Select(condition=c, x=x, y=y), (b(2), x24, x24)),
        C("select_v2", ("SelectV2",), lambda c, x, y: tf.where(c, x, y), (b(2, 4), x24, f32(4))),
        C("unique", ("Unique",), lambda x: tf.unique(x)[0], (i32(8, v="index:4"),)),
        C("unique_idx", ("Unique",), lambda x: tf.unique(x)[1], (f32(8, v="int"),)),
        C("top_k", ("TopKV2",), lambda x: tf.math.top_k(x, 3), (f32(3, 6),)),
        C("approx_top_k", ("ApproxTopK",), lambda x: tf.math.approx_max_k(x, 2), (f32(3, 6),)),
        C("dynamic_stitch", ("DynamicStitch",),
          lambda x, y: tf.dynamic_stitch([tf.constant([0, 2]), tf.constant([1, 3])], [x, y]), (f32(2, 3), f32(2, 3))),
        C("invert_permutation", ("InvertPermutation",),
          lambda x: tf.math.invert_permutation(tf.constant([2, 0, 3, 1])) + x, (i32(4),)),
        C("invert_permutation_dynamic", ("InvertPermutation",), lambda p: tf.math.invert_permutation(p),
          (In((5,), "int32", "permutation", False),)),
        C("roll", ("Roll",), lambda x: tf.roll(x, 2, 1), (x45,)),
        C("bucketize", ("Bucketize",), lambda x: tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5]), (t24,)),
        C("segment_sum", ("SegmentSum",), lambda x: tf.math.segment_sum(x, tf.constant([0, 0, 1, 2])), (x45,)),
        C("unsorted_segment_sum", ("UnsortedSegmentSum",),
          lambda x, i: tf.math.unsorted_segment_sum(x, i, 3), (x45, idx(4, n=3))),
        C("unsorted_segment_max", ("UnsortedSegmentMax",),
          lambda x, i: tf.math.unsorted_segment_max(x, i, 3), (x45, idx(4, n=3))),
        C("unsorted_segment_min", ("UnsortedSegmentMin",),
          lambda x, i: tf.math.unsorted_segment_min(x, i, 3), (x45, idx(4, n=3))),
        C("unsorted_segment_prod", ("UnsortedSegmentProd",),
          lambda x, i: tf.math.unsorted_segment_prod(x, i, 3), (x45, idx(4, n=3))),
        C("xla_dynamic_update_slice", ("XlaDynamicUpdateSlice",), lambda x, u: _xla_dus(tf, x, u), (x45, f32(2, 2))),
        # -- linear algebra -----------------------------------------------------------------------
        C("matmul", ("MatMul",), lambda x: tf.matmul(x, tf.constant(_w(5, 3))), (x45,)),
        C("matmul_transposed", ("MatMul",), lambda x, y: tf.matmul(x, y, transpose_a=True, transpose_b=True),
          (f32(5, 4), f32(3, 5))),
        C("batch_matmul", ("BatchMatMulV2",), lambda x, y: tf.matmul(x, y), (f32(2, 3, 4), f32(2, 4, 5))),
        C("batch_matmul_const", ("BatchMatMulV2",), lambda x: tf.matmul(x, tf.constant(_w(4, 5))), (f32(2, 3, 4),)),
        C("batch_matmul_v1", ("BatchMatMul",), lambda x, y: raw.BatchMatMul(x=x, y=y, adj_y=True),
          (f32(2, 3, 4), f32(2, 5, 4))),
        C("batch_matmul_v3", ("BatchMatMulV3",),
          lambda x, y: raw.BatchMatMulV3(x=x, y=y, Tout=tf.float32), (f32(2, 3, 4), f32(2, 4, 5))),
        C("einsum", ("Einsum",), lambda x, y: tf.einsum("bij,bjk->bik", x, y), (f32(2, 3, 4), f32(2, 4, 5))),
        C("matrix_diag", ("MatrixDiagV3",), lambda x: tf.linalg.diag(x), (f32(2, 3),)),
        C("matrix_diag_v1", ("MatrixDiag",), lambda x: raw.MatrixDiag(diagonal=x), (f32(2, 3),)),
        C("matrix_set_diag", ("MatrixSetDiagV3",), lambda x, d: tf.linalg.set_diag(x, d), (f32(2, 3, 3), f32(2, 3))),
        C("matrix_set_diag_v1", ("MatrixSetDiag",),
          lambda x, d: raw.MatrixSetDiag(input=x, diagonal=d), (f32(2, 3, 3), f32(2, 3))),
        C("matrix_diag_v2", ("MatrixDiagV2",),
          lambda x: raw.MatrixDiagV2(diagonal=x, k=0, num_rows=-1, num_cols=-1, padding_value=0.0), (f32(2, 3),)),
        C("matrix_set_diag_v2", ("MatrixSetDiagV2",),
          lambda x, d: raw.MatrixSetDiagV2(input=x, diagonal=d, k=0), (f32(2, 3, 3), f32(2, 3))),
        C("sparse_matmul", ("SparseMatMul",), lambda x, y: raw.SparseMatMul(a=x, b=y), (f32(2, 3), f32(3, 4))),
        C("band_part", ("MatrixBandPart",), lambda x: tf.linalg.band_part(x, 1, 0), (x45,)),
        # -- neural-network ops -----------------------------------------------------------------------
        C("conv2d", ("Conv2D",), lambda x: tf.nn.conv2d(x, tf.constant(_w(3, 3, 3, 4)), 1, "SAME"), (img,)),
        C("conv2d_strided_valid", ("Conv2D",), lambda x: tf.nn.conv2d(x, tf.constant(_w(2, 2, 3, 2)), 2, "VALID"),
          (img,)),
        C("conv2d_dilated", ("Conv2D",),
          lambda x: tf.nn.conv2d(x, tf.constant(_w(3, 3, 3, 2)), 1, "SAME", dilations=2), (f32(1, 8, 8, 3),)),
        C("depthwise_conv2d", ("DepthwiseConv2dNative",),
          lambda x: tf.nn.depthwise_conv2d(x, tf.constant(_w(3, 3, 3, 2)), [1, 1, 1, 1], "SAME"), (img,)),
        C("conv2d_transpose", ("Conv2DBackpropInput",),
          lambda x: tf.nn.conv2d_transpose(x, tf.constant(_w(3, 3, 2, 3)), [1, 12, 12, 2], 2, "SAME"), (img,)),
        C("conv3d", ("Conv3D",), lambda x: tf.nn.conv3d(x, tf.constant(_w(2, 2, 2, 2, 3)), [1] * 5, "SAME"),
          (f32(1, 3, 4, 4, 2),)),
        C("conv3d_transpose", ("Conv3DBackpropInputV2",),
          lambda x: tf.nn.conv3d_transpose(x, tf.constant(_w(2, 2, 2, 3, 2)), [1, 6, 8, 8, 3], [1, 2, 2, 2, 1]),
          (f32(1, 3, 4, 4, 2),)),
        C("conv2d_nchw", ("Conv2D",),
          lambda x: tf.nn.conv2d(x, tf.constant(_w(3, 3, 2, 4)), 1, "SAME", data_format="NCHW"), (f32(1, 2, 6, 6),)),
        C("avg_pool_nchw", ("AvgPool",), lambda x: tf.nn.avg_pool2d(x, 2, 2, "VALID", data_format="NCHW"),
          (f32(1, 2, 6, 6),)),
        C("max_pool_nchw", ("MaxPool",), lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID", data_format="NCHW"),
          (f32(1, 2, 6, 6),)),
        C("avg_pool", ("AvgPool",), lambda x: tf.nn.avg_pool2d(x, 2, 2, "VALID"), (img,)),
        C("max_pool", ("MaxPool",), lambda x: tf.nn.max_pool2d(x, 3, 1, "SAME"), (img,)),
        C("fused_batch_norm", ("FusedBatchNormV3",), lambda x: _batch_norm(tf, x, "FusedBatchNormV3"), (img,)),
        C("fused_batch_norm_v1", ("FusedBatchNorm",), lambda x: _batch_norm(tf, x, "FusedBatchNorm"), (img,)),
        C("lrn", ("LRN",), lambda x: tf.nn.local_response_normalization(x, 2, 1.0, 0.5, 0.75), (img,)),
        C("resize_bilinear", ("ResizeBilinear",), lambda x: tf.image.resize(x, [9, 4]), (img,)),
        C("resize_bilinear_hpc", ("ResizeBilinear",),
          lambda x: tf.compat.v1.image.resize_bilinear(x, [9, 4], align_corners=True), (img,)),
        C("resize_nearest", ("ResizeNearestNeighbor",), lambda x: tf.image.resize(x, [9, 4], "nearest"), (img,)),
        C("space_to_depth", ("SpaceToDepth",), lambda x: tf.nn.space_to_depth(x, 2), (img,)),
        C("depth_to_space", ("DepthToSpace",), lambda x: tf.nn.depth_to_space(x, 2), (f32(1, 3, 3, 8),)),
        C("space_to_batch", ("SpaceToBatchND",), lambda x: tf.space_to_batch(x, [2, 2], [[0, 0], [0, 0]]), (img,)),
        C("batch_to_space", ("BatchToSpaceND",), lambda x: tf.batch_to_space(x, [2, 2], [[0, 0], [0, 0]]),
          (f32(4, 3, 3, 2),)),
        C("rgb_to_grayscale", ("MatMul",), lambda x: tf.image.rgb_to_grayscale(x), (img,)),
        # -- signal ------------------------------------------------------------------------------------
        C("rfft_abs", ("RFFT", "ComplexAbs"), lambda x: tf.abs(tf.signal.rfft(x)), (f32(2, 8),)),
        C("rfft2d_real", ("RFFT2D", "Real"), lambda x: tf.math.real(tf.signal.rfft2d(x)), (f32(2, 8, 8),)),
        C("rfft_imag", ("RFFT", "Imag"), lambda x: tf.math.imag(tf.signal.rfft(x)), (f32(2, 8),)),
        C("stft", ("RFFT", "ComplexAbs"), lambda x: tf.abs(tf.signal.stft(x, 16, 8)), (f32(1, 64),)),
        # -- in TF's patterns, refused by TF 2.21's converter ------------------------------------------
        C("fused_batch_norm_v2", ("FusedBatchNormV2",), lambda x: _batch_norm(tf, x, "FusedBatchNormV2"), (img,),
          tf_refuses="'tf.FusedBatchNormV2' op is neither a custom op nor a flex op (V1 and V3 convert)"),
        C("complex", ("Complex", "ComplexAbs"), lambda x, y: tf.abs(tf.complex(x, y)), (x24, x24),
          tf_refuses="'tf.Complex' op is neither a custom op nor a flex op"),
        C("tensor_list_gather", ("TensorListGather",), lambda x: _tensor_list_gather(tf, x), (f32(3, 4),),
          tf_refuses="failed to legalize operation 'tf.TensorListGather' (lowering tensor list ops failed)"),
        C("hash_table_lookup", ("LookupTableFindV2",), lambda k: _table(tf).lookup(k),
          (i32(4, v="index:4", fuzz=False),), tf_refuses="'tf.LookupTableFindV2' op is neither a custom op nor a flex op"),
        # -- random -----------------------------------------------------------------------------------
        C("random_uniform", ("RandomUniform",), lambda x: x + tf.random.uniform([4000], seed=3), (f32(4000, v="zeros"),),
          random="uniform"),
        C("random_normal", ("RandomStandardNormal",), lambda x: x + tf.random.normal([4000], seed=1),
          (f32(4000, v="zeros"),), random="normal"),
        C("multinomial", ("Multinomial",), lambda x: tf.random.categorical(x, 2000, seed=2),
          (f32(2, 4, v="logits"),), random="categorical"),
        C("dropout", ("RandomUniform", "GreaterEqual"), lambda x: tf.nn.dropout(x, 0.5, seed=1),
          (f32(4000, v="positive"),), random="dropout"),
        # -- detection --------------------------------------------------------------------------------
        C("nms_v3", ("NonMaxSuppressionV3",), lambda bx, s: raw.NonMaxSuppressionV3(
            boxes=bx, scores=s, max_output_size=3, iou_threshold=0.5, score_threshold=0.1),
          (In((6, 4), values="boxes", fuzz=False), f32(6, v="image"))),
        C("nms_v4", ("NonMaxSuppressionV4",), lambda bx, s: raw.NonMaxSuppressionV4(
            boxes=bx, scores=s, max_output_size=3, iou_threshold=0.5, score_threshold=0.1)[0],
          (In((6, 4), values="boxes", fuzz=False), f32(6, v="image"))),
        C("nms_v4_none_kept", ("NonMaxSuppressionV4",), lambda bx, s: raw.NonMaxSuppressionV4(
            boxes=bx, scores=s, max_output_size=3, iou_threshold=0.5, score_threshold=2.0)[0],
          (In((6, 4), values="boxes", fuzz=False), f32(6, v="image"))),
        C("nms_v5", ("NonMaxSuppressionV5",), lambda bx, s: tf.image.non_max_suppression_with_scores(
            bx, s, 3, soft_nms_sigma=0.0), (In((6, 4), values="boxes", fuzz=False), f32(6, v="image"))),
        C("nms_v4_padded", ("NonMaxSuppressionV4",), lambda bx, s: raw.NonMaxSuppressionV4(
            boxes=bx, scores=s, max_output_size=3, iou_threshold=0.5, score_threshold=0.1,
            pad_to_max_output_size=True), (In((6, 4), values="boxes", fuzz=False), f32(6, v="image"))),
        # -- control flow -----------------------------------------------------------------------------
        C("while", ("StatelessWhile",),
          lambda x: tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 2.0), (0, x))[1], (x24,)),
        C("while_stateful", ("While", "RandomUniform"), lambda x: tf.while_loop(
            lambda i, a: i < 3, lambda i, a: (i + 1, a + tf.random.uniform([2, 4], seed=1)), (0, x))[1],
          (f32(2, 4, v="zeros"),), random="uniform_sum3"),
        C("if", ("StatelessIf",), lambda p, x: tf.cond(p[0], lambda: x * 2.0, lambda: x - 1.0), (b(1), x24)),
        C("if_stateful", ("If", "RandomUniform"),
          lambda p, x: tf.cond(p[0], lambda: x + tf.random.uniform([2, 2000], seed=1), lambda: x + 0.5),
          (In((1,), "bool", "true", False), f32(2, 2000, v="zeros")), random="uniform"),
        C("partitioned_call", ("PartitionedCall",), lambda x: _called(tf)(x) + 1.0, (x24,)),
        C("tensor_list_length", ("TensorListLength", "TensorListElementShape"), lambda x: _tensor_list_sizes(tf, x),
          (In((None, 4)),)),
        C("tensor_list_resize", ("TensorListResize",), lambda x: _tensor_list_resize(tf, x, 2), (f32(3, 4),)),
        C("tensor_list_resize_grow", ("TensorListResize",), lambda x: _tensor_list_resize(tf, x, 5), (f32(3, 4),)),
        C("tensor_list_resize_dynamic", ("TensorListResize",), lambda x, n: _tensor_list_resize(tf, x, n[0]),
          (f32(3, 4), i32(1, v="index:6", fuzz=False))),
        C("tensor_list_concat", ("TensorListConcatV2",), lambda x: _tensor_list_concat(tf, x), (f32(3, 4),)),
        C("tensor_array", ("TensorListReserve", "TensorListSetItem", "TensorListStack"),
          lambda x: _tensor_array(tf, x), (f32(3, 4),)),
        C("tensor_list_from_tensor", ("TensorListFromTensor", "TensorListGetItem"),
          lambda x: _tensor_list_read(tf, x), (f32(3, 4),)),
        C("tensor_list_push_back", ("EmptyTensorList", "TensorListPushBack", "TensorListStack"),
          lambda x: _tensor_list_push(tf, x), (f32(3, 4),)),
    ]
    return cases


def _w(*shape, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.5


def _with_assert(tf, x):
    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(x > -100.0), [x])]):
        return x * 2.0


def _xla_dus(tf, x, u):
    from tensorflow.compiler.tf2xla.python import xla

    return xla.dynamic_update_slice(x, u, tf.constant([1, 2]))


def _batch_norm(tf, x, op_type):
    c = x.shape[-1]
    y = getattr(tf.raw_ops, op_type)(
        x=x, scale=tf.constant(np.linspace(0.5, 1.5, c), tf.float32), offset=tf.constant(np.linspace(-1, 1, c), tf.float32),
        mean=tf.constant(np.linspace(0.1, 0.3, c), tf.float32), variance=tf.constant(np.linspace(1, 2, c), tf.float32),
        epsilon=1e-3, is_training=False)
    return y[0]


@functools.lru_cache(maxsize=None)
def _table(tf):
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer([1, 2, 3], [10.0, 20.0, 30.0]), -1.0)


@functools.lru_cache(maxsize=None)
def _called(tf):
    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def inner(x):
        return x * 3.0

    return inner


def _tensor_array(tf, x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=[4])
    for i in range(3):
        ta = ta.write(i, x[i] * float(i + 1))
    return ta.stack()


def _tensor_list_read(tf, x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=[4]).unstack(x)
    return ta.read(1) + ta.read(2)


def _tensor_list_gather(tf, x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=[4]).unstack(x)
    return ta.gather([2, 0])


def _tensor_list_sizes(tf, x):
    from tensorflow.python.ops import list_ops

    handle = list_ops.tensor_list_from_tensor(x, element_shape=[4])
    length = list_ops.tensor_list_length(handle)
    return tf.cast(length, tf.float32) * tf.cast(list_ops.tensor_list_element_shape(handle, tf.int32)[0], tf.float32)


def _tensor_list_resize(tf, x, size):
    from tensorflow.python.ops import list_ops

    handle = list_ops.tensor_list_from_tensor(x, element_shape=[4])
    handle = list_ops.tensor_list_resize(handle, size)
    return list_ops.tensor_list_stack(handle, tf.float32, element_shape=[4])


def _tensor_list_concat(tf, x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=[4]).unstack(x)
    return ta.concat()


def _tensor_list_push(tf, x):
    from tensorflow.python.ops import list_ops

    handle = list_ops.empty_tensor_list(element_shape=[4], element_dtype=tf.float32)
    for i in range(3):
        handle = list_ops.tensor_list_push_back(handle, x[i] + 1.0)
    return list_ops.tensor_list_stack(handle, tf.float32, element_shape=[4])


@functools.lru_cache(maxsize=None)
def cases() -> dict[str, Case]:
    """name -> case (imports TensorFlow)."""
    import tensorflow as tf

    found: dict[str, Case] = {}
    for case in _cases(tf):
        if case.name in found:
            raise AssertionError(f"sweep case {case.name!r} twice")
        found[case.name] = case
    return found


# -- running a case ------------------------------------------------------------------------------

DYNAMIC_DIM = 3  # what an unknown input dimension is fed as


def feed_shape(spec: In) -> tuple:
    return tuple(DYNAMIC_DIM if d is None else d for d in spec.shape)


def concrete(case: Case, dtype: str | None = None):
    """The case's concrete function; ``dtype``: the fuzz inputs' dtype instead of their own."""
    import tensorflow as tf

    specs = [tf.TensorSpec(i.shape, dtype if dtype and i.fuzz else i.dtype) for i in case.inputs]
    return tf.function(case.build, input_signature=specs, autograph=False).get_concrete_function()


def feeds(case: Case, dtype: str | None = None, seed: int = 0) -> list[np.ndarray]:
    return [make_values(In(feed_shape(i), i.dtype, i.values, i.fuzz), dtype if dtype and i.fuzz else None, seed)
            for i in case.inputs]


def eager(case: Case, values: list[np.ndarray]) -> list[np.ndarray]:
    """TensorFlow's own outputs (eager), flattened as the converted models order them."""
    import tensorflow as tf

    outputs = case.build(*[tf.constant(v) for v in values])
    return [np.asarray(t) for t in tf.nest.flatten(outputs)]


def graph_op_types(fn) -> set[str]:
    """Every op type in a concrete function's graph and the functions it calls."""
    found = {op.type for op in fn.graph.get_operations()}
    for f in fn.graph._functions.values():  # noqa: SLF001 - the library of called functions
        found |= {n.op for n in f.definition.node_def}
    return found


def convert_tf(fn) -> tuple[bytes | None, str]:
    """TF's converter, builtins only: (model, "") or (None, its error)."""
    import contextlib
    import io

    import tensorflow as tf

    from tests.converter.zoo import _silent_fd2

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _silent_fd2():
            return tf.lite.TFLiteConverter.from_concrete_functions([fn]).convert(), ""
    except Exception as exc:  # noqa: BLE001 - TF raises several kinds; the text is what matters
        return None, f"{type(exc).__name__}: {exc}"


def convert_kiln(fn):
    """kiln's converter: (model, report)."""
    import kiln

    converter = kiln.TFLiteConverter.from_concrete_functions([fn])
    return converter.convert(), converter.report


RUNTIMES = ("litert", "litert_ref", "kiln", "kiln_ref")


def interpreter(model: bytes, runtime: str):
    if runtime.startswith("litert"):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    else:
        from kiln import Interpreter, OpResolverType
    kwargs = {"experimental_op_resolver_type": OpResolverType.BUILTIN_REF} if runtime.endswith("_ref") else {}
    return Interpreter(model_content=model, **kwargs)


def run(model: bytes, values: list[np.ndarray], runtime: str) -> list[np.ndarray]:
    """``model``'s outputs on ``values`` in ``runtime`` (one of `RUNTIMES`)."""
    it = interpreter(model, runtime)
    details = it.get_input_details()
    for d, v in zip(details, values):
        if tuple(d["shape"]) != v.shape:
            it.resize_tensor_input(d["index"], v.shape)
    it.allocate_tensors()
    for d, v in zip(details, values):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [_output(it, d) for d in it.get_output_details()]


def _output(it, detail: dict) -> np.ndarray:
    try:
        return it.get_tensor(detail["index"])
    except ValueError:  # LiteRT's get_tensor refuses a tensor sized to nothing ("Invalid tensor size")
        shape = tuple(detail["shape"])
        if 0 not in shape:
            raise
        return np.empty(shape, detail["dtype"])


def mismatch(got: np.ndarray, want: np.ndarray, tol: float) -> str | None:
    """Why ``got`` is not ``want`` (None when it is, within ``tol`` for floats; NaN equals NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc":
        if np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True):
            return None
        bad = ~np.isclose(got, want, rtol=tol, atol=tol, equal_nan=True)
        return f"{int(bad.sum())} of {want.size} values differ, e.g. {got[bad][:3]} != {want[bad][:3]}"
    if not np.array_equal(got, want):
        bad = got != want
        return f"{int(bad.sum())} of {want.size} values differ, e.g. {got[bad][:3]} != {want[bad][:3]}"
    return None


def distribution_mismatch(kind: str, got: list[np.ndarray], values: list[np.ndarray],
                          want: list[np.ndarray]) -> str | None:
    """Random ops: shapes and dtypes as TF's, and the distribution ``kind`` says."""
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"shape/dtype {g.shape} {g.dtype} != {w.shape} {w.dtype}"
    out = got[0].astype(np.float64)
    if kind in ("uniform", "uniform_sum3"):
        top = 3.0 if kind == "uniform_sum3" else 1.0
        if out.min() < 0 or out.max() >= top or abs(out.mean() - top / 2) > 0.05 * top:
            return f"not uniform on [0, {top}): min {out.min()}, max {out.max()}, mean {out.mean()}"
    elif kind == "normal":
        if abs(out.mean()) > 0.1 or abs(out.std() - 1.0) > 0.1:
            return f"not standard normal: mean {out.mean()}, std {out.std()}"
    elif kind == "categorical":
        logits = values[0].astype(np.float64)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        freq = np.stack([np.bincount(row.astype(np.int64), minlength=p.shape[-1]) / row.size for row in out])
        if out.min() < 0 or out.max() >= p.shape[-1] or np.abs(freq - p).max() > 0.05:
            return f"frequencies {freq.round(3).tolist()} are not the softmax {p.round(3).tolist()}"
    elif kind == "dropout":
        x = values[0]
        kept = np.isclose(out, 2 * x, rtol=1e-5)
        if not np.all(kept | (out == 0)) or abs(kept.mean() - 0.5) > 0.05:
            return f"not a 0.5 dropout: {kept.mean():.3f} kept"
    return None


def op_versions(model: bytes) -> dict[str, set[int]]:
    import kiln

    found: dict[str, set[int]] = {}
    for _, _, op in kiln.read_model(model).operators():
        found.setdefault(op.name, set()).add(op.version)
    return found


def op_count(model: bytes) -> int:
    import kiln

    return sum(1 for _ in kiln.read_model(model).operators())


@functools.lru_cache(maxsize=None)
def declared_lowerings() -> dict:
    """TF op type / pattern -> the builtins kiln.converter.legalize.coverage reads from its
    emitter (what docs/support_matrix.md shows)."""
    from kiln.converter.legalize import EMITTERS
    from kiln.converter.legalize.coverage import coverage
    from kiln.converter.legalize.patterns import PATTERNS

    return coverage(EMITTERS, PATTERNS)


def undeclared_lowerings(report) -> list[str]:
    """Builtins a conversion's report says a TF op lowered to that the coverage the support
    matrix shows does not list for it (the page would be wrong)."""
    declared = declared_lowerings()
    return [f"{source} lowered to {sorted(set(ops) - declared.get(source, frozenset()))}, which "
            "kiln.converter.legalize.coverage does not find in its emitter (docs/support_matrix.md)"
            for source, ops in sorted(report.lowered.items()) if set(ops) - declared.get(source, frozenset())]


class Gap(Exception):
    """kiln refused a case listed in `KNOWN_GAPS` (the expected failure)."""


def check(case: Case) -> list[str]:
    """Run one sweep case end to end; the problems found (empty: it passes). Raises `Gap` when
    kiln refuses a known gap."""
    import kiln

    fn = concrete(case)
    tf_model, tf_error = convert_tf(fn)
    if case.tf_refuses:
        return [] if tf_model is None else [f"TF's converter now converts it (was: {case.tf_refuses})"]
    if tf_model is None:
        return [f"TF's converter refuses it: {tf_error[-300:]}"]
    try:
        model, report = convert_kiln(fn)
    except kiln.KilnError as exc:
        if case.name in KNOWN_GAPS:
            raise Gap(str(exc).rsplit(". ", 1)[-1]) from None
        return [f"kiln refuses it: {exc}"]
    problems = undeclared_lowerings(report)
    if case.name in KNOWN_GAPS:
        problems.append("kiln converts it now: remove it from KNOWN_GAPS")
    if op_count(model) > op_count(tf_model) + EXTRA_OPS.get(case.name, (0, ""))[0]:
        problems.append(f"kiln writes {op_count(model)} ops, TF {op_count(tf_model)}: "
                        f"{sorted(op_versions(model))} vs {sorted(op_versions(tf_model))}")
    from tests.converter.zoo import run_macs

    values = feeds(case)
    macs = [run_macs(m, "", dict(enumerate(values))) for m in (model, tf_model)]  # "": inputs in order
    if macs[0] > macs[1]:
        problems.append(f"kiln's file does {macs[0]} multiply-accumulates, TF's {macs[1]}")
    ours, theirs = op_versions(model), op_versions(tf_model)
    for name in sorted(set(ours) & set(theirs)):
        if ours[name] != theirs[name]:
            problems.append(f"{name} versions {sorted(ours[name])} != TF's {sorted(theirs[name])}")
    want = eager(case, values)
    tf_out: dict[str, list] = {}
    for runtime in ("litert", "kiln", "kiln_ref"):
        try:
            got = run(model, values, runtime)
        except Exception as exc:  # noqa: BLE001 - reported, with the runtime
            problems.append(f"{runtime}: {type(exc).__name__}: {exc}")
            continue
        if len(got) != len(want):
            problems.append(f"{runtime}: {len(got)} outputs, TF {len(want)}")
            continue
        if case.random:
            why = distribution_mismatch(case.random, got, values, want)
            if why:
                problems.append(f"{runtime}: {why}")
            continue
        for k, (g, w) in enumerate(zip(got, want)):
            why = mismatch(g, w, case.tol)
            if why:  # kiln's file may still do what TF's does in the same kind of runtime
                anchor = "litert_ref" if runtime.endswith("_ref") else "litert"
                if anchor not in tf_out:
                    tf_out[anchor] = run(tf_model, values, anchor)
                if mismatch(g, tf_out[anchor][k], case.tol) is not None:
                    problems.append(f"{runtime}: output {k}: {why}")
    return problems
