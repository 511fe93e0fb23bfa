"""The models bench/runtime_bench.py times kiln's default Interpreter on against LiteRT.

Five Keras models of the kinds people deploy, none of them from the test zoo: MobileNetV2
(alpha 0.5, 96x96), a residual CNN, a transformer block, an LSTM(64) over 32 steps, and a
CNN whose middle activation is a Python custom op (its builtin twin keeps LEAKY_RELU, for
LiteRT, which cannot run Python ops). Random weights; batch norms are set from one real
batch so activations do not fade to constants. Converted by kiln's converter (or TF's),
cached on disk like the test zoo (keyed by this file's builder source and the converter).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.runtime.zoo import _seed, cache_dir  # noqa: E402

#: name -> description, in the bench's order.
MODELS = {
    "mobilenet_v2": "MobileNetV2 alpha 0.5, 96x96x3, 1000 classes",
    "resnet": "residual CNN: 3 stages of 2 residual blocks, 64x64x3",
    "transformer": "transformer block: 4-head attention + LayerNorm + GELU FFN, 64 tokens x 128",
    "lstm": "LSTM(64) over 32 steps of 32 features + Dense",
    "custom_cnn": "CNN with a Python custom op (leaky ReLU) in the middle",
}

#: The custom op's name in the model and its slope (the twin's LEAKY_RELU alpha).
CUSTOM_CODE, ALPHA = "PyLeakyRelu", 0.1


def _calibrated(model, shape):
    """Run one training-mode batch with momentum 0, so batch norms hold real statistics."""
    import keras

    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(np.random.default_rng(7).standard_normal((8, *shape)).astype(np.float32), training=True)
    return model


def keras_mobilenet_v2():
    import keras

    _seed()
    net = _calibrated(keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), alpha=0.5),
                      (96, 96, 3))
    inp = keras.Input((96, 96, 3), batch_size=1)
    return keras.Model(inp, net(inp))


def keras_resnet():
    import keras
    from keras import layers

    _seed()
    inp = keras.Input((64, 64, 3), batch_size=1)
    x = layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inp)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for stage, width in enumerate((32, 64, 128)):
        for block in range(2):
            stride = 2 if stage and not block else 1
            y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
            y = layers.ReLU()(layers.BatchNormalization()(y))
            y = layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(y))
            if stride != 1 or x.shape[-1] != width:
                x = layers.BatchNormalization()(layers.Conv2D(width, 1, strides=stride, use_bias=False)(x))
            x = layers.ReLU()(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    body = keras.Model(inp, layers.Dense(10)(x))
    return _calibrated(body, (64, 64, 3))


def keras_transformer():
    import keras
    from keras import layers

    _seed()
    inp = keras.Input((64, 128), batch_size=1)
    att = layers.MultiHeadAttention(num_heads=4, key_dim=32)(inp, inp)
    x = layers.LayerNormalization(epsilon=1e-6)(inp + att)
    ff = layers.Dense(256, activation="gelu")(x)
    ff = layers.Dense(128)(ff)
    return keras.Model(inp, layers.LayerNormalization(epsilon=1e-6)(x + ff))


def keras_lstm():
    import keras

    _seed()
    return keras.Sequential([keras.Input((32, 32), batch_size=1), keras.layers.LSTM(64), keras.layers.Dense(10)])


def keras_custom_cnn():
    import keras
    from keras import layers

    _seed()
    inp = keras.Input((64, 64, 3), batch_size=1)
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(inp)
    x = layers.Conv2D(64, 3, padding="same")(x)
    x = layers.LeakyReLU(negative_slope=ALPHA)(x)     # the op that becomes the Python custom op
    x = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.Conv2D(128, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(10)(x))


def _convert(model, converter: str) -> bytes:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if converter == "tf":
        import tensorflow as tf

        with contextlib.redirect_stdout(io.StringIO()):
            return tf.lite.TFLiteConverter.from_keras_model(model).convert()
    import kiln

    with contextlib.redirect_stdout(io.StringIO()):
        return kiln.TFLiteConverter.from_keras_model(model).convert()


def model_bytes(name: str, converter: str = "kiln", rebuild: bool = False) -> bytes:
    """The converted model (for custom_cnn: its builtin twin, with LEAKY_RELU), cached under
    a hash of its Keras builder's source; ``rebuild`` converts again (after converter changes)."""
    keras_builder = globals()[f"keras_{name}"]
    key = hashlib.sha256((inspect.getsource(keras_builder) + converter).encode()).hexdigest()[:10]
    path = cache_dir() / f"bench-{name}-{converter}-{key}.tflite"
    if rebuild or not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(_convert(keras_builder(), converter))
        os.replace(tmp, path)
    return path.read_bytes()


def with_custom_op(twin: bytes) -> bytes:
    """``twin`` with its one LEAKY_RELU turned into the custom op CUSTOM_CODE."""
    from kiln.format import read_model, write_model

    model = read_model(twin)
    leaky = [op for op in model.main.operators if op.op_type == "LEAKY_RELU"]
    if len(leaky) != 1:
        raise ValueError(f"expected one LEAKY_RELU in the twin, found {len(leaky)}")
    op = leaky[0]
    op.op_type, op.custom_code, op.version, op.options = "CUSTOM", CUSTOM_CODE, 1, {}
    return write_model(model)


def register_custom_op(resolver) -> None:
    """The Python kernel of CUSTOM_CODE (a custom_op_registerers entry)."""
    import kiln

    def invoke(context, node):
        x = node.inputs[0].data
        # max(x, alpha x) is leaky ReLU for 0 < alpha < 1, bit for bit LiteRT's; np.where(x > 0, ...)
        # gives the same values but costs ~15x more on this size (a bool mask and a gather)
        node.outputs[0].data = np.maximum(x, x * np.float32(ALPHA))

    resolver.add_custom(CUSTOM_CODE, kiln.Registration(invoke=invoke))
