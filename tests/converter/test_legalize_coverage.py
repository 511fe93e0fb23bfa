"""The TF ops issue #30 found kiln refusing, each as one-op tf.functions converted by TF's
converter and by kiln's: kiln writes TF's builtins or fewer, at TF's versions, and LiteRT,
kiln's default Interpreter and its reference kernels (BUILTIN_REF) compute what TensorFlow
computes, special values included (NaN, +-inf, -0.0, exact quotients, negative integer
division, repeated scatter indices, empty tensors, rank 0). Random ops are checked by
seeds (LiteRT's numbers), shapes and distributions; what kiln cannot express is a
ConversionError naming the op.

Two LiteRT behaviours shape the comparisons: its reference kernels (and so kiln's, which
are bit-exact with them) clamp an arithmetic result of +-inf to +-FLT_MAX, and its default
EXP kernel turns NaN into 0, so a NaN in a reduce_logsumexp row is lost in LiteRT (TF's own
file loses it the same way; kiln's reference kernels keep it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from tests.converter import zoo  # noqa: E402

tf = zoo._tf()
S, F32, I32, I64 = tf.TensorSpec, tf.float32, tf.int32, tf.int64
FLT_MAX = np.finfo(np.float32).max
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e30, -1e30, 1e-30, 3e38, -3.0, 0.5,
                    6.0], np.float32)
DIVISORS = np.array([2, 3, -3, 1, 1, -0.0, 0.0, 0.5, 2, 3, -7, 1e-30, 1e-38, 2, -0.5, 3], np.float32)
X8 = np.array([[np.nan, np.inf, -np.inf, -0.0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10, 11, 12]], np.float32)
LOGITS = np.array([[1, 2, 3, 4], [-np.inf, 0, 1, 2], [1e30, -1e30, 0, 0]], np.float32)
# lgamma: poles, negative non-integers, the roots at 1 and 2, huge and tiny values (not
# denormals: XNNPACK flushes them to zero, lgamma's pole)
LGAMMA_X = np.concatenate([SPECIAL, np.linspace(-10.3, 40, 97, dtype=np.float32), np.array(
    [-4, -5, -100, -100.5, 1e5, 1e20, 0.99, 1.01, 2.01, 1.99, 1e-8, -1e-8, -0.5, -1.5], np.float32)])


@dataclass
class Case:
    fn: object
    specs: list
    feeds: list


def i32(*v):
    return np.array(v, np.int32)


def f32(*v):
    return np.array(v, np.float32)


def _sparse_to_dense(indices, shape, values, default):
    return tf.raw_ops.SparseToDense(sparse_indices=indices, output_shape=shape, sparse_values=values,
                                    default_value=default)


CASES = {
    # math
    "is_nan": Case(lambda x: tf.math.is_nan(x), [S([None], F32)], [SPECIAL]),
    "is_nan_rank0": Case(lambda x: tf.math.is_nan(x), [S([], F32)], [np.float32(np.nan)]),
    "is_nan_empty": Case(lambda x: tf.math.is_nan(x), [S([None, 3], F32)], [np.zeros((0, 3), np.float32)]),
    "is_finite": Case(lambda x: tf.math.is_finite(x), [S([None], F32)], [SPECIAL]),
    "is_inf": Case(lambda x: tf.math.is_inf(x), [S([None], F32)], [SPECIAL]),
    "truncate_div_int32": Case(lambda a, b: tf.truncatediv(a, b), [S([10], I32), S([10], I32)], [
        i32(7, -7, 7, -7, 0, 1, -1, 2147483647, -2147483647, -6), i32(2, 2, -2, -2, 3, 3, 3, -1, 2, 3)]),
    "truncate_div_broadcast": Case(lambda a, b: tf.truncatediv(a, b), [S([2, 3], I32), S([3], I32)],
                                   [i32([7, -7, 9], [-9, 8, -8]), i32(2, -3, 4)]),
    "truncate_div_float32": Case(lambda a, b: tf.truncatediv(a, b), [S([None], F32), S([None], F32)],
                                 [SPECIAL, DIVISORS]),
    "lgamma": Case(lambda x: tf.math.lgamma(x), [S([LGAMMA_X.size], F32)], [LGAMMA_X]),
    "lgamma_dynamic_2d": Case(lambda x: tf.math.lgamma(x), [S([None, 4], F32)], [LGAMMA_X[:124].reshape(-1, 4)]),
    "lgamma_rank0": Case(lambda x: tf.math.lgamma(x), [S([], F32)], [np.float32(-2.5)]),
    "lgamma_float16": Case(lambda x: tf.math.lgamma(x), [S([8], tf.float16)],
                           [np.array([0.5, 1, 2, 3.5, -2.5, 0, 10, np.inf], np.float16)]),
    "logsumexp": Case(lambda x: tf.reduce_logsumexp(x, axis=-1), [S([None, 4], F32)], [np.array(
        [[1, 2, 3, 4], [np.inf, 1, 2, 3], [-np.inf] * 4, [1e30, 1e30, -1e30, 0], [-0.0, 0, 0, 0]], np.float32)]),
    "logsumexp_keepdims_all": Case(lambda x: tf.reduce_logsumexp(x, keepdims=True), [S([2, 4], F32)],
                                   [np.array([[1, 2, 3, 4], [-np.inf, 0, 1e-30, -5]], np.float32)]),
    # scatter / shape
    "scatter_update": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3]], u), [S([8], F32), S([2], F32)],
                           [X8[0], f32(7, np.nan)]),
    "scatter_update_repeated": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3], [1]], u),
                                    [S([8], F32), S([3], F32)], [X8[0], f32(1, 2, 3)]),
    "scatter_update_indices_input": Case(lambda x, i, u: tf.tensor_scatter_nd_update(x, i, u),
                                         [S([4, 3], F32), S([2, 1], I32), S([2, 3], F32)],
                                         [np.full((4, 3), np.inf, np.float32), i32([0], [2]), np.ones((2, 3), np.float32)]),
    "scatter_update_int64_indices": Case(lambda x, i, u: tf.tensor_scatter_nd_update(x, i, u),
                                         [S([4, 3], F32), S([2, 1], I64), S([2, 3], F32)],
                                         [X8.reshape(4, 4)[:, :3].copy(), np.array([[3], [1]], np.int64),
                                          -np.ones((2, 3), np.float32)]),
    "scatter_update_dynamic_batch": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3]], u),
                                         [S([4, None], F32), S([2, None], F32)],
                                         [np.zeros((4, 5), np.float32), np.ones((2, 5), np.float32)]),
    "scatter_update_2d_index": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[0, 1], [2, 2]], u),
                                    [S([3, 3], F32), S([2], F32)], [np.zeros((3, 3), np.float32), f32(4, -0.0)]),
    "scatter_update_int32": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3]], u), [S([4], I32), S([2], I32)],
                                 [i32(1, 2, 3, 4), i32(-5, 9)]),
    "scatter_update_int64": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3]], u), [S([4], I64), S([2], I64)],
                                 [np.array([1, 2, 3, 2**40], np.int64), np.array([-5, 9], np.int64)]),
    "scatter_update_bool": Case(lambda x, u: tf.tensor_scatter_nd_update(x, [[1], [3]], u),
                                [S([4], tf.bool), S([2], tf.bool)], [np.array([1, 0, 1, 1], bool), np.array([1, 0], bool)]),
    "scatter_update_no_updates": Case(lambda x, i, u: tf.tensor_scatter_nd_update(x, i, u),
                                      [S([4], F32), S([None, 1], I32), S([None], F32)],
                                      [f32(1, -0.0, np.inf, 4), np.zeros((0, 1), np.int32), np.zeros(0, np.float32)]),
    "scatter_add_repeated": Case(lambda x, u: tf.tensor_scatter_nd_add(x, [[1], [4], [1]], u),
                                 [S([8], F32), S([3], F32)], [X8[0], f32(1, 2, 3)]),
    "scatter_add_dynamic": Case(lambda x, i, u: tf.tensor_scatter_nd_add(x, i, u),
                                [S([None, 3], F32), S([None, 1], I32), S([None, 3], F32)],
                                [np.zeros((4, 3), np.float32), i32([0], [2], [0]), np.ones((3, 3), np.float32)]),
    "scatter_add_int64": Case(lambda x, u: tf.tensor_scatter_nd_add(x, [[1], [3]], u), [S([4], I64), S([2], I64)],
                              [np.array([1, 2, 3, 4], np.int64), np.array([-5, 9], np.int64)]),
    "scatter_sub": Case(lambda x, u: tf.tensor_scatter_nd_sub(x, [[1], [3]], u), [S([4], I32), S([2], I32)],
                        [i32(1, 2, 3, 4), i32(-5, 9)]),
    "sparse_to_dense": Case(lambda x: _sparse_to_dense([[0], [2]], [4], x[:2], 0.0), [S([4], F32)], [f32(np.inf, -0.0, 1, 2)]),
    "sparse_to_dense_inputs": Case(lambda i, v: _sparse_to_dense(i, [4, 3], v, -1.0), [S([2, 2], I32), S([2], F32)],
                                   [i32([0, 1], [3, 2]), f32(np.nan, -0.0)]),
    "sparse_to_dense_scalar_value": Case(lambda i: _sparse_to_dense(i, [5], 1, 0), [S([3], I32)], [i32(0, 2, 4)]),
    "sparse_to_dense_int64": Case(lambda i, v: _sparse_to_dense(i, tf.constant([4, 3], I64), v, tf.constant(0, I64)),
                                  [S([2, 2], I64), S([2], I64)], [np.array([[0, 1], [3, 2]], np.int64),
                                                                   np.array([5, -6], np.int64)]),
    "sparse_tensor_to_dense": Case(lambda v: tf.sparse.to_dense(tf.sparse.SparseTensor([[0, 1], [2, 0]], v, [3, 3])),
                                   [S([2], F32)], [f32(1, 2)]),
    "roll": Case(lambda x: tf.roll(x, 1, 0), [S([4], F32)], [X8[0, :4]]),
    "roll_negative_past_the_length": Case(lambda x: tf.roll(x, -11, 1), [S([2, 8], F32)], [X8]),
    "roll_whole_length": Case(lambda x: tf.roll(x, 8, 1), [S([2, 8], F32)], [X8]),
    "roll_two_axes": Case(lambda x: tf.roll(x, [1, -2], [0, 1]), [S([2, 8], F32)], [X8]),
    "roll_one_axis_twice": Case(lambda x: tf.roll(x, [1, 2], [1, -1]), [S([2, 8], F32)], [X8]),
    "roll_int32": Case(lambda x: tf.roll(x, 2, -1), [S([2, 8], I32)], [np.arange(16, dtype=np.int32).reshape(2, 8)]),
    "roll_dynamic_batch": Case(lambda x: tf.roll(x, 3, 1), [S([None, 8], F32)], [X8]),
    "roll_dynamic_axis": Case(lambda x: tf.roll(x, 3, 0), [S([None, 8], F32)], [X8]),
    "roll_shift_input": Case(lambda x, s: tf.roll(x, s, 1), [S([2, 8], F32), S([], I32)], [X8, np.int32(-13)]),
    "roll_shift_vector_input": Case(lambda x, s: tf.roll(x, s, [0, 1]), [S([None, None], F32), S([2], I64)],
                                    [X8, np.array([3, 5], np.int64)]),
    "roll_empty": Case(lambda x: tf.roll(x, 2, 1), [S([0, 8], F32)], [np.zeros((0, 8), np.float32)]),
    "bitcast_float_to_int": Case(lambda x: tf.bitcast(x, I32), [S([None], F32)], [X8[0]]),
    "bitcast_bytes_to_float": Case(lambda x: tf.bitcast(x, F32), [S([None, 4], tf.uint8)],
                                   [np.arange(8, dtype=np.uint8).reshape(2, 4)]),
    "bitcast_float_to_bytes": Case(lambda x: tf.bitcast(x, tf.uint8), [S([None], F32)], [X8[0]]),
    "bitcast_int64": Case(lambda x: tf.bitcast(x, I32), [S([3], I64)], [np.array([-1, 2**40, 5], np.int64)]),
    "bitcast_rank0": Case(lambda x: tf.bitcast(x, tf.uint32), [S([], I32)], [np.int32(-1)]),
    "set_diag": Case(lambda x: tf.linalg.set_diag(x, tf.ones([3])), [S([3, 3], F32)], [X8.reshape(-1)[:9].reshape(3, 3)]),
    "set_diag_batch": Case(lambda x, d: tf.linalg.set_diag(x, d), [S([None, 3, 3], F32), S([None, 3], F32)],
                           [np.zeros((2, 3, 3), np.float32), X8[:, :3]]),
    "set_diag_wide": Case(lambda x, d: tf.linalg.set_diag(x, d), [S([3, 4], F32), S([3], F32)],
                          [np.ones((3, 4), np.float32), X8[0, :3]]),
    "set_diag_tall": Case(lambda x, d: tf.linalg.set_diag(x, d), [S([4, 2], F32), S([2], F32)],
                          [np.ones((4, 2), np.float32), X8[0, :2]]),
    "set_diag_int32": Case(lambda x, d: tf.linalg.set_diag(x, d), [S([3, 3], I32), S([3], I32)],
                           [np.zeros((3, 3), np.int32), i32(1, -2, 3)]),
    "set_diag_v1": Case(lambda x, d: tf.raw_ops.MatrixSetDiag(input=x, diagonal=d), [S([3, 3], F32), S([3], F32)],
                        [np.zeros((3, 3), np.float32), X8[0, :3]]),
    "set_diag_v2": Case(lambda x, d: tf.raw_ops.MatrixSetDiagV2(input=x, diagonal=d, k=0), [S([3, 3], F32), S([3], F32)],
                        [np.zeros((3, 3), np.float32), X8[0, :3]]),
    # losses
    "sparse_xent": Case(lambda x: tf.nn.sparse_softmax_cross_entropy_with_logits(tf.constant([1, 2, 0]), x),
                        [S([3, 4], F32)], [LOGITS]),
    "sparse_xent_labels_input": Case(lambda x, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                                     [S([3, 4], F32), S([3], I32)], [LOGITS, i32(3, 2, 0)]),
    "sparse_xent_int64_dynamic": Case(lambda x, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                                      [S([None, 4], F32), S([None], I64)], [LOGITS, np.array([3, 2, 0], np.int64)]),
    "sparse_xent_3d": Case(lambda x, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                           [S([1, 3, 4], F32), S([1, 3], I32)], [LOGITS[None], i32([3, 2, 0])]),
    "sparse_xent_backprop": Case(lambda x, y: tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(features=x, labels=y),
                                 [S([3, 4], F32), S([3], I32)], [LOGITS, i32(3, 2, 0)]),
    "sparse_xent_keras": Case(lambda x, y: tf.keras.losses.sparse_categorical_crossentropy(y, x, from_logits=True),
                              [S([3, 4], F32), S([3], I32)], [LOGITS, i32(3, 2, 0)]),
    "xent": Case(lambda x, y: tf.nn.softmax_cross_entropy_with_logits(y, x), [S([3, 4], F32), S([3, 4], F32)],
                 [LOGITS, np.eye(4, dtype=np.float32)[[3, 1, 0]] * 0.5 + 0.125]),
    "xent_backprop": Case(lambda x, y: tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=x, labels=y),
                          [S([3, 4], F32), S([3, 4], F32)], [LOGITS[[0, 0, 2]], np.eye(4, dtype=np.float32)[[3, 1, 0]]]),
}
RUNTIMES = ["litert", "kiln", "kiln_ref"]


def concrete(fn, specs):
    return tf.function(fn, input_signature=specs, autograph=False).get_concrete_function()


def convert_tf(cf) -> bytes | None:
    try:
        with zoo._silent_fd2():
            return tf.lite.TFLiteConverter.from_concrete_functions([cf]).convert()
    except Exception:  # noqa: BLE001 - TF's converter refuses some of these (roll of a dynamic axis ...)
        return None


def interpreter(model: bytes, runtime: str):
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter(model_content=model)
    if runtime == "kiln_ref":
        return kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    return kiln.Interpreter(model_content=model)


def run(interp, feeds) -> list[np.ndarray]:
    details = interp.get_input_details()
    for d, x in zip(details, feeds):
        interp.resize_tensor_input(d["index"], np.shape(x))
    interp.allocate_tensors()
    for d, x in zip(details, feeds):
        interp.set_tensor(d["index"], np.asarray(x))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def runs_in_litert(model: bytes | None, feeds) -> bool:
    try:
        return model is not None and bool(run(interpreter(model, "litert"), feeds))
    except (RuntimeError, ValueError):
        return False


@pytest.fixture(scope="module")
def converted():
    """name -> (kiln's file, TF's file or None, TensorFlow's outputs), converted once. TF's
    file is the anchor only where LiteRT runs it (TF folds a roll of an empty tensor into an
    empty constant LiteRT cannot load, and writes lgamma of a [None, 4] input with constants
    LiteRT cannot broadcast)."""
    out = {}
    for name, case in CASES.items():
        cf = concrete(case.fn, case.specs)
        ref = cf(*[tf.constant(x) for x in case.feeds])
        ref = [np.asarray(r) for r in (ref if isinstance(ref, (list, tuple)) else [ref])]
        theirs = convert_tf(cf)
        out[name] = (kiln.TFLiteConverter.from_concrete_functions([cf]).convert(),
                     theirs if runs_in_litert(theirs, case.feeds) else None, ref)
    return out


def ops_of(model: bytes) -> list[tuple[str, int]]:
    return [(op.name, op.version) for _, _, op in kiln.read_model(model).operators()]


def assert_matches(actual, expected, clamps: bool, what: str) -> float:
    """Equal to TensorFlow within 1e-4 (relative above 1), NaN and infinities in place; with
    ``clamps`` (LiteRT's reference kernels) +-FLT_MAX stands for +-inf. Returns the error."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        f"{what}: {actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
    if expected.dtype.kind not in "fc":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return 0.0
    if clamps:
        actual = np.where(np.isinf(expected) & (np.abs(actual) == np.finfo(actual.dtype).max), expected, actual)
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{what}: NaN at {actual} vs {expected}"
    inf = np.isinf(expected)
    assert np.array_equal(actual[inf], expected[inf]) and not np.isinf(actual[~inf]).any(), \
        f"{what}: infinities {actual} vs {expected}"
    finite = np.isfinite(expected)
    e = expected[finite].astype(np.float64)
    err = float(np.max(np.abs(actual[finite] - e) / np.maximum(1.0, np.abs(e)), initial=0.0))
    assert err <= 1e-4, f"{what}: error {err}"
    return err


@pytest.mark.parametrize("name", CASES)
def test_ops_and_versions_are_tf_s_or_fewer(converted, name):
    ours, theirs, _ = converted[name]
    mine = ops_of(ours)
    assert all(op != "CUSTOM" for op, _ in mine)
    if theirs is None:
        return
    tfs = ops_of(theirs)
    assert len(mine) <= len(tfs), f"kiln {mine} vs TF {tfs}"
    versions = {}
    for op, v in tfs:
        versions.setdefault(op, set()).add(v)
    for op, v in mine:
        assert v in versions.get(op, {v}), f"{op} v{v}, TF writes v{sorted(versions[op])}"


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", CASES)
def test_outputs_are_tensorflow_s(converted, name, runtime):
    ours, _, ref = converted[name]
    outputs = run(interpreter(ours, runtime), CASES[name].feeds)
    for k, (a, e) in enumerate(zip(outputs, ref)):
        assert_matches(a, e, runtime == "kiln_ref", f"{name} output {k} in {runtime}")


def test_lgamma_is_a_third_shorter_than_tf_s(converted):
    ours, theirs, _ = converted["lgamma"]
    assert len(ops_of(ours)) <= len(ops_of(theirs)) - 19


def test_scatter_keeps_infinities_tf_s_file_turns_to_nan(converted):
    """TF's x * (1 - mask) + scatter(updates) gives NaN where an infinite x is updated."""
    ours, theirs, ref = converted["scatter_update_indices_input"]
    feeds = CASES["scatter_update_indices_input"].feeds
    assert np.isnan(run(interpreter(theirs, "litert"), feeds)[0]).any()
    assert_matches(run(interpreter(ours, "litert"), feeds)[0], ref[0], False, "kiln")


def test_logsumexp_of_a_row_with_nan():
    """kiln's reference kernels give TensorFlow's NaN; LiteRT's EXP makes exp(NaN) 0 in TF's
    file and in kiln's alike."""
    cf = concrete(lambda x: tf.reduce_logsumexp(x, axis=-1), [S([2, 4], F32)])
    x = np.array([[np.nan, 1, 2, 3], [1, 2, 3, 4]], np.float32)
    ref = np.asarray(cf(tf.constant(x)))
    ours, theirs = kiln.TFLiteConverter.from_concrete_functions([cf]).convert(), convert_tf(cf)
    assert_matches(run(interpreter(ours, "kiln_ref"), [x])[0], ref, True, "reference kernels")
    np.testing.assert_array_equal(run(interpreter(ours, "litert"), [x])[0], run(interpreter(theirs, "litert"), [x])[0])


def test_out_of_range_labels_give_nan_like_tf_s_file():
    cf = concrete(lambda x, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x), [S([3, 4], F32), S([3], I32)])
    feeds = [LOGITS, i32(4, -1, 0)]
    ours = kiln.TFLiteConverter.from_concrete_functions([cf]).convert()
    theirs = run(interpreter(convert_tf(cf), "litert"), feeds)[0]
    for runtime in RUNTIMES:
        loss = run(interpreter(ours, runtime), feeds)[0]
        assert np.isnan(loss[:2]).all() and np.isnan(theirs[:2]).all() and loss[2] == pytest.approx(theirs[2])


# -- random ops: seeds, shapes, distributions ----------------------------------------------------------

RANDOM = {
    "uniform": (lambda x: x + tf.random.uniform([4, 3], seed=3), ["RANDOM_UNIFORM"]),
    "uniform_range": (lambda x: x + tf.random.uniform([4, 3], -2.0, 5.0, seed=4), ["RANDOM_UNIFORM"]),
    "normal": (lambda x: x + tf.random.normal([4, 3], 3.0, 2.0, seed=1), ["RANDOM_STANDARD_NORMAL"]),
    "dropout": (lambda x: tf.nn.dropout(x + 1.0, 0.5, seed=1), ["RANDOM_UNIFORM"]),
    "dynamic_shape": (lambda x: x + tf.random.uniform(tf.shape(x), seed=5), ["SHAPE", "RANDOM_UNIFORM"]),
}


def invokes(model: bytes, runtime: str, feeds, n: int = 3) -> list[np.ndarray]:
    interp = interpreter(model, runtime)
    first = run(interp, feeds)[0]
    rest = []
    for _ in range(n - 1):
        interp.invoke()
        rest.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    return [first, *rest]


@pytest.mark.parametrize("name", RANDOM)
def test_seeded_random_ops_draw_litert_s_numbers(name):
    fn, expected_ops = RANDOM[name]
    spec = S([None, 3] if name == "dynamic_shape" else [4, 3], F32)
    cf = concrete(fn, [spec])
    ours, theirs = kiln.TFLiteConverter.from_concrete_functions([cf]).convert(), convert_tf(cf)
    assert len(ops_of(ours)) <= len(ops_of(theirs))
    assert set(expected_ops) <= {op for op, _ in ops_of(ours)}
    assert [(op, v) for op, v in ops_of(ours) if op.startswith("RANDOM")] == \
        [(op, v) for op, v in ops_of(theirs) if op.startswith("RANDOM")]
    x = np.zeros((4, 3), np.float32)
    expected = invokes(theirs, "litert", [x])
    assert not np.array_equal(expected[0], expected[1]), "two invokes differ"
    for runtime in RUNTIMES:
        for a, e in zip(invokes(ours, runtime, [x]), expected):
            np.testing.assert_allclose(a, e, rtol=0, atol=1e-5, err_msg=runtime)


def test_random_draws_follow_their_distribution():
    n = 4000
    cf = concrete(lambda x: (x + tf.random.uniform([n], -2.0, 5.0), x + tf.random.normal([n], 3.0, 2.0),
                             tf.nn.dropout(x + 1.0, 0.25)), [S([n], F32)])
    ours = kiln.TFLiteConverter.from_concrete_functions([cf]).convert()
    for runtime in RUNTIMES:
        uniform, normal, dropped = run(interpreter(ours, runtime), [np.zeros(n, np.float32)])
        assert -2 <= uniform.min() and uniform.max() < 5 and abs(uniform.mean() - 1.5) < 0.15
        assert abs(normal.mean() - 3) < 0.15 and abs(normal.std() - 2) < 0.15
        kept = dropped != 0
        np.testing.assert_allclose(dropped[kept], 1 / 0.75, rtol=1e-6)
        assert abs(kept.mean() - 0.75) < 0.04


def test_multinomial_draws_categories_by_their_logits():
    cf = concrete(lambda x, k: tf.random.categorical(x, k, seed=2), [S([None, 4], F32), S([], I32)])
    ours, theirs = kiln.TFLiteConverter.from_concrete_functions([cf]).convert(), convert_tf(cf)
    assert ops_of(ours) == ops_of(theirs) == [("MULTINOMIAL", 1)]
    logits = np.array([[np.log(0.1), np.log(0.2), np.log(0.3), np.log(0.4)], [-np.inf, 0, 0, -np.inf]], np.float32)
    feeds = [logits, np.int32(3000)]
    expected = run(interpreter(theirs, "litert"), feeds)[0]
    for runtime in RUNTIMES:
        draws = run(interpreter(ours, runtime), feeds)[0]
        np.testing.assert_array_equal(draws, expected)
        assert draws.dtype == np.int64 and set(np.unique(draws[1])) == {1, 2}
        np.testing.assert_allclose(np.bincount(draws[0], minlength=4) / 3000, [0.1, 0.2, 0.3, 0.4], atol=0.03)


def test_unseeded_random_ops_are_neither_folded_nor_merged():
    """Two tf.random.uniform calls with the same (constant) operands stay two ops that draw
    different numbers."""
    cf = concrete(lambda x: (x + tf.random.uniform([64]), x + tf.random.uniform([64])), [S([64], F32)])
    ours = kiln.TFLiteConverter.from_concrete_functions([cf]).convert()
    assert [op for op, _ in ops_of(ours)].count("RANDOM_UNIFORM") == 2
    for runtime in RUNTIMES:
        a, b = run(interpreter(ours, runtime), [np.zeros(64, np.float32)])
        assert not np.array_equal(a, b)


def test_seeded_stream_restarts_when_the_interpreter_reprepares():
    """LiteRT seeds a node's generator in Prepare: after a resize the stream starts over."""
    cf = concrete(lambda x: x + tf.random.uniform(tf.shape(x), seed=3), [S([None, 2], F32)])
    ours = kiln.TFLiteConverter.from_concrete_functions([cf]).convert()

    def firsts(runtime):
        interp = interpreter(ours, runtime)
        return [run(interp, [np.zeros((rows, 2), np.float32)])[0][0].tolist() for rows in (2, 2, 3, 3, 2)]

    expected = firsts("litert")
    assert expected[0] == expected[2] == expected[4] != expected[1]
    assert firsts("kiln") == firsts("kiln_ref") == expected


# -- what kiln cannot express ---------------------------------------------------------------------

REFUSED = {
    "TruncateDiv": (lambda x: tf.truncatediv(x, x), [S([4], I64)], "int64 has no builtin"),
    "MatrixSetDiagV3": (lambda x, d: tf.linalg.set_diag(x, d, k=1), [S([3, 3], F32), S([2], F32)], "main diagonal"),
    "Roll": (lambda x, a: tf.roll(x, 1, a), [S([3, 3], F32), S([], I32)], "roll axis must be a constant"),
    "RandomUniform": (lambda x: x + tf.random.uniform([4], dtype=tf.float64), [S([4], tf.float64)], "float64 draws"),
    "IsNan": (lambda x: tf.math.is_nan(x), [S([4], tf.float16)], "float16 is not supported"),
    "Lgamma": (lambda x: tf.math.lgamma(x), [S([4], tf.float64)], "float64 is not supported"),
    "SparseToDense": (lambda i, v: _sparse_to_dense(i, [2, 2, 2, 2, 2], v, 0.0), [S([1, 5], I32), S([1], F32)],
                      "at most 4"),
    "TensorScatterUpdate": (lambda x, u: tf.tensor_scatter_nd_update(x, [[1]], u), [S([4], tf.float16), S([1], tf.float16)],
                            "SCATTER_ND takes no float16 operands"),
    "Multinomial": (lambda x: tf.random.categorical(x, 3), [S([2, 4], tf.float64)], "float64 logits"),
    "SparseSoftmaxCrossEntropyWithLogits": (lambda x, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, x),
                                            [S([2, None], F32), S([2], I32)], "known number of classes"),
}


@pytest.mark.parametrize("op", REFUSED)
def test_what_has_no_builtin_is_a_conversion_error_naming_the_op(op):
    fn, specs, why = REFUSED[op]
    with pytest.raises(kiln.ConversionError, match=op) as info:
        kiln.TFLiteConverter.from_concrete_functions([concrete(fn, specs)]).convert()
    assert any(why in d for d in info.value.details), info.value.details


def test_roll_axis_out_of_range_is_a_conversion_error():
    with pytest.raises(kiln.ConversionError, match="Roll") as info:
        kiln.TFLiteConverter.from_concrete_functions([concrete(lambda x: tf.roll(x, 1, 5), [S([3, 3], F32)])]).convert()
    assert any("out of range" in d for d in info.value.details)


# -- a model: log-sum-exp pooling over masked time steps --------------------------------------------

@pytest.fixture(scope="module")
def pooling_model():
    import keras

    class LogSumExpPool(keras.layers.Layer):
        def call(self, h, mask_bias):
            return keras.ops.logsumexp(h + mask_bias, axis=1)

    x, bias = keras.Input((6, 5), name="frames"), keras.Input((6, 1), name="mask_bias")
    y = keras.layers.Dense(3)(LogSumExpPool()(keras.layers.Dense(8, activation="tanh")(x), bias))
    model = keras.Model([x, bias], y)
    zoo.randomize(model)
    rng = np.random.default_rng(30)
    frames = rng.standard_normal((3, 6, 5)).astype(np.float32)
    mask = np.zeros((3, 6, 1), np.float32)
    mask[1, 4:] = -np.inf  # padded steps of a shorter sequence
    return model, [frames, mask], np.asarray(model([frames, mask]))


def test_keras_log_sum_exp_pooling_from_keras_and_saved_model(pooling_model, tmp_path):
    model, feeds, expected = pooling_model
    path = str(tmp_path / "saved")
    model.export(path, verbose=False)
    from_keras = kiln.TFLiteConverter.from_keras_model(model).convert()
    from_saved = kiln.TFLiteConverter.from_saved_model(path).convert()
    with zoo._silent_fd2():
        theirs = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    for data in (from_keras, from_saved):
        names = [op for op, _ in ops_of(data)]
        assert "CUSTOM" not in names and {"REDUCE_MAX", "EXP", "LOG"} <= set(names)
        assert len(names) <= len(ops_of(theirs))
        for runtime in RUNTIMES:
            interp = interpreter(data, runtime)
            inputs = [d["name"] for d in interp.get_input_details()]
            ordered = [feeds[0] if "frames" in n else feeds[1] for n in inputs]
            assert_matches(run(interp, ordered)[0], expected, runtime == "kiln_ref", runtime)
