"""Operator versions (the op records' rules) and min_runtime_version (runtime_version.cc)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.format.runtime_version import (  # noqa: E402
    max_version, min_runtime_version_bytes, model_runtime_version, op_runtime_version,
)
from kiln.errors import ModelError  # noqa: E402
from kiln.ir import Model  # noqa: E402
from tests.converter import zoo  # noqa: E402


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


def pairs(data):
    return zoo.op_pairs(data)


def both(tf, fn):
    ours = kiln.TFLiteConverter.from_concrete_functions([fn]).convert()
    with zoo._silent_fd2():
        theirs = tf.lite.TFLiteConverter.from_concrete_functions([fn]).convert()
    return ours, theirs


def test_dilated_depthwise_is_version_2_like_tf(tf):
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 4, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 12, 12, 4], tf.float32, name="x")])
    def f(x):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 1, 1], padding="SAME",
                                                dilations=[1, 2, 2, 1])

    ours, theirs = both(tf, f.get_concrete_function())
    assert ("DEPTHWISE_CONV_2D", 2) in pairs(ours)
    assert pairs(ours) == pairs(theirs)
    assert kiln.read_model(ours).metadata["min_runtime_version"].rstrip(b"\0") == b"1.12.0"


def test_keras_dilated_depthwise_is_fused_to_version_2():
    case = zoo.case("k3_dilated")
    assert ("DEPTHWISE_CONV_2D", 2) in pairs(case.kiln_model)
    assert not {op for op, _ in pairs(case.kiln_model)} & {"SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND"}


@pytest.mark.parametrize("dtype, expected", [("float32", 1), ("int64", 4)])
def test_add_version_follows_the_type(tf, dtype, expected):
    @tf.function(input_signature=[tf.TensorSpec([3], dtype, name="a"), tf.TensorSpec([3], dtype, name="b")])
    def f(a, b):
        return a + b

    ours, theirs = both(tf, f.get_concrete_function())
    assert pairs(ours) == {("ADD", expected)} == pairs(theirs)


def test_keep_num_dims_fully_connected_is_version_5():
    case = zoo.case("k3_transformer")
    assert ("FULLY_CONNECTED", 5) in pairs(case.kiln_model)


def test_strided_slice_with_new_axis_is_canonicalised(tf):
    @tf.function(input_signature=[tf.TensorSpec([4, 5], tf.float32, name="x")])
    def f(x):
        return x[tf.newaxis, 1:3, ..., ::2]

    ours, theirs = both(tf, f.get_concrete_function())
    ours_ops = {op for op, _ in pairs(ours)}
    assert ("STRIDED_SLICE", 1) in pairs(ours) and ours_ops <= {op for op, _ in pairs(theirs)}
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    out = kiln.Interpreter(model_content=ours).get_signature_runner()(x=x)["output_0"]
    np.testing.assert_array_equal(out, x[np.newaxis, 1:3, ..., ::2])


def test_conv3d_when_its_record_exists():
    if kiln.ops.get("CONV_3D") is None:
        pytest.skip("no CONV_3D op record yet (kiln.ops); the legalisation waits for it")
    case_src = zoo.k3_conv3d()
    data, _, _ = zoo.convert_kiln(case_src)
    assert ("CONV_3D", 1) in pairs(data)


# -- runtime_version table ---------------------------------------------------------------------

def test_runtime_version_lookup():
    assert op_runtime_version("CONV_2D", 1) == "1.5.0"
    assert op_runtime_version("DEPTHWISE_CONV_2D", 2) == "1.12.0"
    assert op_runtime_version("FULLY_CONNECTED", 5) == "2.0.0"
    assert op_runtime_version("BROADCAST_TO", 1) is None  # version 1 never shipped
    with pytest.raises(ModelError, match="CONV_2D version 99 has no runtime version"):
        op_runtime_version("CONV_2D", 99)
    with pytest.raises(ModelError, match="NOT_AN_OP version 1: kiln has no op record"):
        op_runtime_version("NOT_AN_OP", 1)


def test_versions_compare_as_integers():
    assert max_version(["1.9.0", "1.10.0", "1.5.0"]) == "1.10.0"
    assert max_version(["2.3.0", "1.14.0"]) == "2.3.0"
    assert max_version(["1.10", "1.10.1"]) == "1.10.1"
    assert max_version([]) == ""


def test_metadata_bytes():
    assert min_runtime_version_bytes("1.5.0") == b"1.5.0" + b"\0" * 11
    assert len(min_runtime_version_bytes("2.13.0")) == 16
    assert min_runtime_version_bytes("") == b"\0" * 16


def test_model_minimum_is_the_max_over_ops():
    m = Model()
    sg = m.add_subgraph("main")
    for op_type, version in (("ADD", 1), ("WHILE", 1), ("DEPTHWISE_CONV_2D", 2), ("CUSTOM", 1)):
        sg.add_operator(op_type, [], [], version=version)
    assert model_runtime_version(m) == "1.15.0"
