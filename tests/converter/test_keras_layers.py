"""A sweep over Keras 3 layers: each converts, runs in LiteRT and kiln like Keras, and uses no
more operators than TF's converter (where TF's converter manages at all)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tests.converter import zoo  # noqa: E402
from tests.converter.test_zoo import assert_matches, kiln_interpreter, litert, run_signature  # noqa: E402


def _layers():
    import keras

    L = keras.layers
    return {
        "conv1d_transpose": ((10, 3), [L.Conv1DTranspose(4, 3, strides=2)]),
        "conv2d_groups": ((8, 8, 4), [L.Conv2D(4, 3, groups=2)]),
        # Keras wraps dilated 3-D convs in 5-D SPACE_TO_BATCH_ND, which LiteRT refuses: one CONV_3D.
        "conv3d_dilated": ((6, 7, 8, 2), [L.Conv3D(3, 3, dilation_rate=2, padding="same"),
                                          L.Conv3D(2, 2, dilation_rate=(1, 2, 2))]),
        "depthwise1d": ((10, 3), [L.DepthwiseConv1D(3, depth_multiplier=2)]),
        "separable1d": ((10, 3), [L.SeparableConv1D(4, 3, activation="relu")]),
        "pool1d": ((10, 3), [L.AveragePooling1D(2), L.MaxPooling1D(2, padding="same")]),
        "global_pooling": ((4, 4, 2), [L.GlobalMaxPooling2D(keepdims=True), L.GlobalAveragePooling2D()]),
        "upsampling": ((4, 3), [L.UpSampling1D(2), L.Reshape((2, 2, 2, 3)), L.UpSampling3D(2)]),
        "padding_cropping": ((4, 3), [L.ZeroPadding1D(1), L.Cropping1D((1, 0)), L.Reshape((5, 3, 1)),
                                      L.ZeroPadding2D(((1, 0), (2, 1))), L.Cropping2D(((0, 1), (1, 1)))]),
        "normalization": ((5,), [L.Normalization(mean=np.arange(5.0), variance=np.arange(1, 6.0)), L.Rescaling(0.5, 1.0)]),
        "center_crop": ((8, 8, 3), [L.CenterCrop(4, 4)]),
        "group_norm": ((6, 8), [L.GroupNormalization(groups=2)]),
        "unit_norm": ((6,), [L.UnitNormalization()]),
        "layer_norm_axes": ((4, 6), [L.LayerNormalization(axis=[-2, -1])]),
        "batch_norm_1d": ((6, 4), [L.BatchNormalization()]),
        "prelu": ((6,), [L.PReLU()]),
        "relu_variants": ((6,), [L.ELU(0.5), L.LeakyReLU(0.2), L.ReLU(max_value=4.0, negative_slope=0.1, threshold=0.5)]),
        "softmax_axis": ((4, 5), [L.Softmax(axis=1)]),
        "time_distributed": ((3, 4), [L.TimeDistributed(L.Dense(2))]),
        "repeat_flatten": ((4,), [L.RepeatVector(3), L.Flatten()]),
        "inference_noops": ((4, 4, 2), [L.SpatialDropout2D(0.5), L.GaussianNoise(0.3), L.GaussianDropout(0.2)]),
        "resizing": ((6, 6, 2), [L.Resizing(4, 5, interpolation="nearest"), L.Resizing(7, 7, crop_to_aspect_ratio=True)]),
        "embedding_lstm": ((5,), [L.Embedding(10, 4), L.LSTM(3)]),
        "bidirectional": ((5, 3), [L.Bidirectional(L.LSTM(4, return_sequences=True))]),
        "gru_dynamic": ((5, 3), [L.GRU(4, reset_after=False)]),
    }


NAMES = [
    "conv1d_transpose", "conv2d_groups", "conv3d_dilated", "depthwise1d", "separable1d", "pool1d", "global_pooling", "upsampling",
    "padding_cropping", "normalization", "center_crop", "group_norm", "unit_norm", "layer_norm_axes",
    "batch_norm_1d", "prelu", "relu_variants", "softmax_axis", "time_distributed", "repeat_flatten",
    "inference_noops", "resizing", "embedding_lstm", "bidirectional", "gru_dynamic",
]


@pytest.mark.parametrize("name", NAMES)
def test_layer(name):
    shape, layers = _layers()[name]
    model = zoo._seq(shape, *layers)
    if name not in ("normalization",):
        zoo.randomize(model)
    rng = np.random.default_rng(1)
    if name.startswith("embedding"):
        x = rng.integers(0, 10, (2,) + shape).astype(np.float32)
    else:
        x = rng.standard_normal((2,) + shape).astype(np.float32)
    src = zoo._keras_source(model, [x])
    data, report, _ = zoo.convert_kiln(src)
    ref = src.reference["serving_default"]
    feeds = src.feeds["serving_default"]
    assert_matches(run_signature(litert(data), "serving_default", feeds), ref, f"{name} LiteRT")
    assert_matches(run_signature(kiln_interpreter(data), "serving_default", feeds), ref, f"{name} kiln")
    tf_data, _, _ = zoo.convert_tf(src)
    if tf_data is not None:
        assert zoo.op_count(data) <= zoo.op_count(tf_data), report.summary()
