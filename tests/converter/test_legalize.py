"""Legalisation of individual TF ops: each tf.function converts, and LiteRT (and kiln, where
it has the kernels) computes what TensorFlow computes."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from tests.converter import zoo  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 5)).astype(np.float32)
IDS = np.array([0, 2, 2, 1], np.int32)


def _cases(tf):
    """name -> (function of x [4, 5] float32 and ids [4] int32, expected TFLite ops subset)."""
    return {
        "band_part": (lambda x, ids: tf.linalg.band_part(x, 1, 0), {"SELECT_V2"}),
        "reverse_sequence": (lambda x, ids: tf.reverse_sequence(x, ids + 1, seq_axis=1, batch_axis=0),
                             {"REVERSE_SEQUENCE"}),
        "segment_sum": (lambda x, ids: tf.math.segment_sum(x, tf.constant([0, 0, 1, 2])), {"SEGMENT_SUM"}),
        "unsorted_segments": (lambda x, ids: tf.math.unsorted_segment_max(x, ids, 3)
                              + tf.math.unsorted_segment_sum(x, ids, 3), {"UNSORTED_SEGMENT_MAX"}),
        "strided": (lambda x, ids: x[::-1, 1:4:2] * 2.0 + x[-1, tf.newaxis, :2][:, :1], {"STRIDED_SLICE"}),
        "gather_nd_scatter": (lambda x, ids: tf.gather_nd(x, [[0, 1], [3, 4]])
                              + tf.scatter_nd(tf.reshape(ids[1:3] % 2, [2, 1]), x[0, :2], [2]), {"GATHER_ND", "SCATTER_ND"}),
        "gather_axis": (lambda x, ids: tf.gather(x, ids, axis=0) + tf.gather(x, [4, 0, 1, 2, 3], axis=1), {"GATHER"}),
        "one_hot_topk": (lambda x, ids: tf.one_hot(ids, 5) + tf.math.top_k(x, 5).values, {"ONE_HOT", "TOPK_V2"}),
        "arg_cumsum": (lambda x, ids: tf.cast(tf.argmax(x, 1), tf.float32) + tf.cumsum(x, 1, exclusive=True)[:, 0]
                       + tf.cast(tf.argmin(x, 1), tf.float32), {"ARG_MAX", "ARG_MIN", "CUMSUM"}),
        "pads": (lambda x, ids: tf.pad(x, [[1, 0], [0, 2]], constant_values=3.0)[:4, :5]
                 + tf.pad(x, [[1, 1], [2, 0]], mode="REFLECT")[1:5, 2:7], {"PADV2", "MIRROR_PAD"}),
        "tile_split_unpack": (lambda x, ids: tf.concat(tf.split(tf.tile(x, [1, 2]), 2, axis=1), 0)[:4]
                              + tf.stack(tf.unstack(x, axis=0)), {"TILE", "SPLIT"}),
        "range_fill": (lambda x, ids: x + tf.cast(tf.range(5), tf.float32) + tf.fill([4, 1], 0.5), {"ADD"}),
        "select_clip": (lambda x, ids: tf.where(x > 0, tf.clip_by_value(x, -0.5, 0.5), x * 3.0), {"SELECT_V2"}),
        "integer_math": (lambda x, ids: tf.cast(ids // 2 + ids % 2 + tf.pow(ids, 2), tf.float32)[:, None] + x,
                         {"FLOOR_DIV", "FLOOR_MOD", "POW"}),
        "reductions": (lambda x, ids: tf.reduce_max(x, 1, keepdims=True) - tf.reduce_min(x, 1, keepdims=True)
                       + tf.reduce_prod(x, 0) + tf.reduce_sum(x) + tf.math.reduce_std(x), {"REDUCE_MAX", "SUM"}),
        "logic": (lambda x, ids: tf.cast(tf.logical_or(x > 0.5, tf.logical_not(x < -0.5)), tf.float32)
                  + tf.cast(tf.reduce_any(x > 2.0), tf.float32), {"LOGICAL_OR", "LOGICAL_NOT"}),
        "unary": (lambda x, ids: tf.abs(x) + tf.sqrt(tf.abs(x)) + tf.math.rsqrt(tf.abs(x) + 1) + tf.square(x)
                  + tf.sin(x) + tf.cos(x) + tf.math.log1p(tf.abs(x)) + tf.math.expm1(x) + tf.round(x)
                  + tf.math.reciprocal(x + 10.0) + tf.sign(x) + tf.floor(x) + tf.math.ceil(x), {"ABS", "SQRT"}),
        "space_depth": (lambda x, ids: tf.nn.depth_to_space(tf.nn.space_to_depth(tf.reshape(x, [1, 2, 10, 1]), 2), 2)[0, :, :, 0],
                        {"SPACE_TO_DEPTH", "DEPTH_TO_SPACE"}),
        "matmul_variants": (lambda x, ids: tf.matmul(x, x, transpose_b=True)[:, :1] + tf.linalg.matmul(x[:, :4], x[:4, :]),
                            {"BATCH_MATMUL"}),
        "resize": (lambda x, ids: tf.image.resize(tf.reshape(x, [1, 4, 5, 1]), [3, 7])[0, :, :5, 0]
                   + tf.image.resize(tf.reshape(x, [1, 4, 5, 1]), [3, 5], method="nearest")[0, :, :, 0],
                   {"RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"}),
    }


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


NAMES = ["band_part", "reverse_sequence", "segment_sum", "unsorted_segments", "strided", "gather_nd_scatter",
         "gather_axis", "one_hot_topk", "arg_cumsum", "pads", "tile_split_unpack", "range_fill", "select_clip",
         "integer_math", "reductions", "logic", "unary", "space_depth", "matmul_variants", "resize"]


@pytest.mark.parametrize("name", NAMES)
def test_op(tf, name):
    body, expected_ops = _cases(tf)[name]

    @tf.function(input_signature=[tf.TensorSpec([4, 5], tf.float32, name="x"), tf.TensorSpec([4], tf.int32, name="ids")])
    def f(x, ids):
        return body(x, ids)

    data = kiln.TFLiteConverter.from_concrete_functions([f.get_concrete_function()]).convert()
    model = kiln.read_model(data)
    ops = {op.name for _, _, op in model.operators()}
    assert expected_ops <= ops, sorted(ops)
    expected = f(X, IDS).numpy()
    from ai_edge_litert.interpreter import Interpreter

    out = Interpreter(model_content=data).get_signature_runner()(x=X, ids=IDS)["output_0"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    if all(kiln.ops.get(op) is not None for op in ops):
        out = kiln.Interpreter(model_content=data).get_signature_runner()(x=X, ids=IDS)["output_0"]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
