"""The runtime test zoo: real models made by TensorFlow's own converter.

kiln's interpreter has to run what TensorFlow writes, not only what kiln writes, so every
model here comes from ``tf.lite.TFLiteConverter``. Conversion is slow (TensorFlow import,
tracing), so the files are cached in a temp directory per TensorFlow version, each keyed by
its builder's source; later test sessions and ``bench/runtime_bench.py`` reuse them.

Use ``zoo_path(name)`` / ``zoo_bytes(name)``; ``sample_inputs(model_bytes, seed)`` makes
deterministic inputs from a model's input details.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import os
import tempfile
from pathlib import Path

import numpy as np

#: Model name -> one-line description (the builders below, in this order).
ZOO = {
    "mlp": "Dense MLP (keras 3): FULLY_CONNECTED + RELU/TANH + SOFTMAX",
    "cnn": "small CNN (keras 3): CONV_2D, MAX_POOL_2D, AVERAGE_POOL, FULLY_CONNECTED",
    "mobilenet": "MobileNetV2 alpha=0.35 on 32x32 (depthwise separable blocks, RELU6, residual ADD)",
    "transformer": "transformer block: MultiHeadAttention + LayerNorm + GELU feed-forward",
    "lstm": "tf_keras LSTM -> fused UNIDIRECTIONAL_SEQUENCE_LSTM",
    "bilstm": "tf_keras Bidirectional LSTM -> 2 x UNIDIRECTIONAL_SEQUENCE_LSTM",
    "control_flow": "tf.while_loop + tf.cond -> WHILE and IF subgraphs",
    "variables": "tf.Module with resource variables; signatures 'accumulate' and 'read'",
    "dynamic_batch": "dense + conv model whose batch dimension is dynamic (shape_signature -1)",
}


def _quiet_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def _from_keras(model) -> bytes:
    tf = _quiet_tf()
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    with contextlib.redirect_stdout(io.StringIO()):  # keras 3 prints the exported endpoints
        return conv.convert()


def _from_functions(funcs, trackable) -> bytes:
    tf = _quiet_tf()
    conv = tf.lite.TFLiteConverter.from_concrete_functions(funcs, trackable)
    return conv.convert()


def _seed():
    tf = _quiet_tf()
    import keras
    import tf_keras

    tf.random.set_seed(7)
    keras.utils.set_random_seed(7)
    tf_keras.utils.set_random_seed(7)


def build_mlp() -> bytes:
    import keras

    _seed()
    model = keras.Sequential([
        keras.Input((20,), batch_size=1),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="tanh"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    return _from_keras(model)


def build_cnn() -> bytes:
    import keras

    _seed()
    model = keras.Sequential([
        keras.Input((28, 28, 1), batch_size=1),
        keras.layers.Conv2D(8, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    return _from_keras(model)


def build_mobilenet() -> bytes:
    import keras

    _seed()
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35, classes=10)
    # Freshly initialised, inference-mode batch norms let activations shrink ~1e-11 by the
    # classifier (every input then gives softmax 0.1 everywhere, which proves nothing). One
    # training-mode pass with momentum 0 sets the moving statistics to a real batch's.
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(np.random.default_rng(7).standard_normal((8, 32, 32, 3)).astype(np.float32), training=True)
    # A fixed batch of one keeps LiteRT's (and kiln's) plans static, like a deployed model.
    inp = keras.Input((32, 32, 3), batch_size=1)
    return _from_keras(keras.Model(inp, model(inp)))


def build_transformer() -> bytes:
    import keras

    _seed()
    inp = keras.Input((16, 32), batch_size=1)
    att = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(inp, inp)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(inp + att)
    ff = keras.layers.Dense(64, activation="gelu")(x)
    ff = keras.layers.Dense(32)(ff)
    out = keras.layers.LayerNormalization(epsilon=1e-6)(x + ff)
    return _from_keras(keras.Model(inp, out))


def build_lstm() -> bytes:
    import tf_keras

    _seed()
    model = tf_keras.Sequential([
        tf_keras.Input((12, 8), batch_size=1),
        tf_keras.layers.LSTM(16, return_sequences=True),
        tf_keras.layers.LSTM(8),
        tf_keras.layers.Dense(4),
    ])
    return _from_keras(model)


def build_bilstm() -> bytes:
    import tf_keras

    _seed()
    model = tf_keras.Sequential([
        tf_keras.Input((10, 6), batch_size=1),
        tf_keras.layers.Bidirectional(tf_keras.layers.LSTM(12, return_sequences=True)),
        tf_keras.layers.Dense(3),
    ])
    return _from_keras(model)


def build_control_flow() -> bytes:
    tf = _quiet_tf()

    class Loop(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32), tf.TensorSpec([], tf.int32)])
        def __call__(self, x, n):
            def body(i, acc):
                acc = tf.cond(tf.reduce_sum(acc) > 10.0, lambda: acc * 0.5, lambda: acc + tf.sin(acc) + 1.0)
                return i + 1, acc

            _, out = tf.while_loop(lambda i, acc: i < n, body, (tf.constant(0), x))
            return {"out": tf.cond(n > 3, lambda: out * 2.0, lambda: out - 1.0)}

    m = Loop()
    return _from_functions([m.__call__.get_concrete_function()], m)


def build_variables() -> bytes:
    tf = _quiet_tf()

    class Accumulator(tf.Module):
        def __init__(self):
            super().__init__()
            self.total = tf.Variable(tf.fill([2, 3], 0.5), name="total")
            self.count = tf.Variable(0.0, name="count")

        @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
        def accumulate(self, x):
            self.total.assign_add(x * 2.0)
            self.count.assign_add(1.0)
            return {"total": self.total.read_value(), "mean": self.total / self.count}

        @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
        def read(self, scale):
            return {"scaled": self.total * scale}

    m = Accumulator()
    with tempfile.TemporaryDirectory() as d:
        tf.saved_model.save(m, d, signatures={"accumulate": m.accumulate.get_concrete_function(),
                                              "read": m.read.get_concrete_function()})
        conv = tf.lite.TFLiteConverter.from_saved_model(d, signature_keys=["accumulate", "read"])
        return conv.convert()


def build_dynamic_batch() -> bytes:
    import keras

    _seed()
    inp = keras.Input((8, 8, 3))  # batch None -> shape_signature [-1, 8, 8, 3]
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(5)(x)
    return _from_keras(keras.Model(inp, out))


BUILDERS = {name: globals()[f"build_{name}"] for name in ZOO}


# -- cache ----------------------------------------------------------------------------------

def _tensorflow_version() -> str:
    """The installed TensorFlow's version, read from its distribution (tensorflow-cpu or
    tensorflow) without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "none"


def cache_dir() -> Path:
    """Where converted models live: $KILN_ZOO_DIR, else a temp dir per TensorFlow version."""
    env = os.environ.get("KILN_ZOO_DIR")
    if env:
        path = Path(env)
    else:
        path = Path(tempfile.gettempdir()) / f"kiln-zoo-tf{_tensorflow_version()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_model(name: str, build) -> Path:
    """Path of the model ``build()`` returns, built once and cached under ``name`` plus a
    hash of the builder's source (editing a builder rebuilds only that model)."""
    key = hashlib.sha256(inspect.getsource(build).encode()).hexdigest()[:10]
    path = cache_dir() / f"{name}-{key}.tflite"
    if not path.exists():
        data = build()
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: concurrent sessions never see half a file
    return path


def zoo_path(name: str) -> Path:
    """Path of zoo model ``name``, converting it with TensorFlow on first use."""
    if name not in BUILDERS:
        raise KeyError(f"no zoo model {name!r}; have {sorted(BUILDERS)}")
    return cached_model(name, BUILDERS[name])


def zoo_bytes(name: str) -> bytes:
    return zoo_path(name).read_bytes()


def sample_inputs(details, seed: int = 0, batch: int | None = None) -> list[np.ndarray]:
    """Deterministic inputs for ``details`` (a get_input_details() list or signature dict)."""
    rng = np.random.default_rng(seed)
    items = details.values() if isinstance(details, dict) else details
    out = []
    for d in items:
        shape = [int(s) for s in d["shape"]]
        if batch is not None and shape:
            shape[0] = batch
        dtype = np.dtype(d["dtype"])
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind in "iu":
            out.append(rng.integers(1, 6, size=shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            raise TypeError(f"no sample input for dtype {dtype}")
    return out
