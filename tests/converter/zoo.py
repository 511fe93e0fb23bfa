"""The converter's test zoo: small models built in code, each converted by kiln and by
TensorFlow's converter (the anchor), with TensorFlow's own outputs as the reference.

`case(name)` builds a model once per session: its sources, feeds, TensorFlow reference
outputs, kiln's conversion (bytes, report, seconds) and TF's (bytes or None when TF's
converter fails on it, seconds). `bench/convert_bench.py` uses the same builders.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@dataclass
class Source:
    """A model to convert: ``kind`` is "keras", "functions" or "saved_model"."""

    kind: str
    obj: Any
    feeds: dict[str, dict[str, np.ndarray]]          # signature key -> input name -> value
    reference: dict[str, dict[str, np.ndarray]]      # signature key -> output name -> value
    trackable: Any = None
    tf_fails: bool = False                           # TF's converter cannot convert it
    note: str = ""
    #: TensorFlow on other feeds: (signature key, input name -> value) -> output name -> value;
    #: None when the model has no reference at other shapes (e.g. stateful SavedModels).
    run: Callable[[str, dict], dict] | None = None


@dataclass
class Case:
    name: str
    source: Source
    kiln_model: bytes
    kiln_report: Any
    kiln_seconds: float
    tf_model: bytes | None
    tf_seconds: float
    tf_error: str = ""
    extra: dict = field(default_factory=dict)


def _tf():
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return tf


def _rng(seed: int = 0):
    return np.random.default_rng(seed)


def randomize(model, seed: int = 0) -> None:
    """Non-trivial weights everywhere (biases, batch-norm statistics) so folding is tested."""
    rng = _rng(seed)
    for w in model.weights:
        shape = tuple(w.shape)
        if "variance" in w.name:
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.uniform(-0.5, 0.5, shape)
        w.assign(value.astype(np.dtype(w.dtype.name if hasattr(w.dtype, "name") else w.dtype)))


def _keras_outputs(model, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    out = model(inputs if len(inputs) > 1 else inputs[0], training=False)
    if isinstance(out, dict):
        return {k: np.asarray(v) for k, v in out.items()}
    outs = out if isinstance(out, (list, tuple)) else [out]
    return {f"output_{i}": np.asarray(v) for i, v in enumerate(outs)}


def _keras_source(model, inputs: list[np.ndarray], *, tf_fails: bool = False, note: str = "") -> Source:
    """A Keras model with its reference outputs (signature names as TF's converter writes)."""
    names = [t.name for t in model.inputs]
    return Source("keras", model, {"serving_default": dict(zip(names, inputs))},
                  {"serving_default": _keras_outputs(model, inputs)}, tf_fails=tf_fails, note=note,
                  run=lambda key, feeds: _keras_outputs(model, [feeds[n] for n in names]))


def _tf_keras_outputs(model, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    out = model(inputs if len(inputs) > 1 else inputs[0], training=False)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return {name: np.asarray(v) for name, v in zip(model.output_names, outs)}


def _tf_keras_source(model, inputs: list[np.ndarray]) -> Source:
    names = list(model.input_names)
    return Source("keras", model, {"serving_default": dict(zip(names, inputs))},
                  {"serving_default": _tf_keras_outputs(model, inputs)},
                  run=lambda key, feeds: _tf_keras_outputs(model, [feeds[n] for n in names]))


# -- Keras 3 -------------------------------------------------------------------------------------

def _seq(shape, *layers, batch=None):
    import keras

    x = keras.Input(shape, batch_size=batch)
    y = x
    for layer in layers:
        y = layer(y)
    return keras.Model(x, y)


def k3_mlp() -> Source:
    import keras

    L = keras.layers
    m = _seq((8,), L.Dense(16, activation="relu"), L.Dense(12, activation="tanh"), L.Dense(4, activation="softmax"))
    randomize(m)
    return _keras_source(m, [_rng(1).standard_normal((3, 8)).astype(np.float32)])


def k3_activations() -> Source:
    """Every Keras activation on one Dense output, side by side (no amplifying chain)."""
    import keras

    L = keras.layers
    x = keras.Input((6,), name="features")
    h = L.Dense(8)(x)
    acts = ["relu", "relu6", "sigmoid", "tanh", "swish", "elu", "selu", "softplus", "softsign",
            "hard_sigmoid", "hard_swish", "leaky_relu", "exponential", "mish", "log_softmax", "softmax", "linear"]
    branches = [L.Activation(a, name=f"act_{a}")(h) for a in acts]
    y = L.Concatenate()(branches)
    m = keras.Model(x, y)
    randomize(m)
    return _keras_source(m, [_rng(2).standard_normal((2, 6)).astype(np.float32)])


def k3_gelu_shared() -> Source:
    """Exact and tanh GELU of one shared tensor (TF's converter then leaves Erfc unlowered)."""
    import keras

    L = keras.layers
    x = keras.Input((6,), name="features")
    h = L.Dense(8)(x)
    y = L.Concatenate()([L.Activation("gelu")(h), h,
                         L.Activation(lambda t: keras.activations.gelu(t, approximate=True))(h)])
    m = keras.Model(x, y)
    randomize(m)
    return _keras_source(m, [_rng(2).standard_normal((2, 6)).astype(np.float32)], tf_fails=True,
                         note="TF's GELU fusion fails when the GELU input has other users")


def k3_cnn() -> Source:
    import keras

    L = keras.layers
    m = _seq((16, 16, 3), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPooling2D(),
             L.Conv2D(8, 3, activation="relu6"), L.AveragePooling2D(2), L.Flatten(), L.Dense(10, activation="softmax"))
    randomize(m)
    return _keras_source(m, [_rng(3).standard_normal((2, 16, 16, 3)).astype(np.float32)])


def k3_separable() -> Source:
    import keras

    L = keras.layers
    m = _seq((12, 12, 4), L.SeparableConv2D(8, 3, padding="same", activation="relu"), L.BatchNormalization(),
             L.DepthwiseConv2D(3, strides=2, depth_multiplier=2), L.Conv2DTranspose(6, 3, strides=2),
             L.GlobalAveragePooling2D(), L.Dense(3))
    randomize(m)
    return _keras_source(m, [_rng(4).standard_normal((2, 12, 12, 4)).astype(np.float32)])


def k3_dilated() -> Source:
    import keras

    L = keras.layers
    m = _seq((16, 16, 4), L.DepthwiseConv2D(3, dilation_rate=2, padding="same"), L.Conv2D(4, 3, dilation_rate=2),
             L.GlobalMaxPooling2D())
    randomize(m)
    return _keras_source(m, [_rng(5).standard_normal((2, 16, 16, 4)).astype(np.float32)],
                         note="kiln folds SPACE_TO_BATCH_ND/BATCH_TO_SPACE_ND into dilated convolutions")


def k3_shared_conv_relu() -> Source:
    """A NASNet-style cell: a 1×1 conv's output read raw and through a ReLU (a fused copy of
    the conv would add a convolution)."""
    import keras

    L = keras.layers
    x = keras.Input((8, 8, 16))
    h = L.Conv2D(32, 1)(x)
    y = L.Add()([h, L.Conv2D(32, 1)(L.ReLU()(h))])
    m = keras.Model(x, L.GlobalAveragePooling2D()(y))
    randomize(m)
    return _keras_source(m, [_rng(27).standard_normal((2, 8, 8, 16)).astype(np.float32)])


def k3_squeeze_excite() -> Source:
    """A MobileNetV3-style squeeze-and-excite block on a 1×1 map: its pooling moves no data."""
    import keras

    L = keras.layers
    x = keras.Input((1, 1, 24))
    s = L.GlobalAveragePooling2D(keepdims=True)(x)
    s = L.Conv2D(24, 1, activation="hard_sigmoid")(L.Conv2D(6, 1, activation="relu")(s))
    m = keras.Model(x, L.Multiply()([x, s]))
    randomize(m)
    return _keras_source(m, [_rng(28).standard_normal((2, 1, 1, 24)).astype(np.float32)])


def k3_attention_fresh() -> Source:
    """An encoder block as Keras initialises it (zero biases and LayerNorm betas), with a
    dynamic batch and sequence: the zero-bias ADDs must go as TF removes them."""
    import keras

    L = keras.layers
    x = keras.Input((None, 16), name="tokens")
    h = L.LayerNormalization()(L.Add()([x, L.MultiHeadAttention(2, 8)(x, x)]))
    m = keras.Model(x, L.LayerNormalization()(L.Add()([h, L.Dense(16)(L.Dense(32, activation="relu")(h))])))
    keras.utils.set_random_seed(29)
    return _keras_source(m, [_rng(29).standard_normal((2, 5, 16)).astype(np.float32)])


def k3_conv1d_embedding() -> Source:
    import keras

    L = keras.layers
    m = _seq((10,), L.Embedding(40, 8), L.Conv1D(6, 3, activation="relu"), L.MaxPooling1D(2),
             L.GlobalAveragePooling1D(), L.Dense(2))
    randomize(m)
    return _keras_source(m, [_rng(6).integers(0, 40, (3, 10)).astype(np.float32)])


def k3_shapes() -> Source:
    import keras

    L = keras.layers
    m = _seq((8, 8, 3), L.ZeroPadding2D(1), L.Cropping2D(2), L.UpSampling2D(), L.Resizing(5, 5),
             L.UpSampling2D(interpolation="bilinear"), L.Permute((2, 1, 3)), L.Reshape((-1, 3)), L.Dropout(0.5),
             L.Flatten(), L.RepeatVector(2), L.Reshape((2, 10, 30)), L.Cropping2D(((0, 1), (2, 3)), data_format="channels_first"))
    return _keras_source(m, [_rng(7).standard_normal((2, 8, 8, 3)).astype(np.float32)])


def k3_multi_io() -> Source:
    import keras

    L = keras.layers
    a = keras.Input((4,), name="a")
    b = keras.Input((6,), name="b")
    h = L.Concatenate()([a, L.Dense(4)(b)])
    h1 = L.Dense(5, name="first")(h)
    h2 = L.Multiply()([L.Dense(5)(a), L.Dense(5)(b)])
    h3 = L.Subtract()([L.Add()([h1, h2]), L.Maximum()([h1, h2])])
    m = keras.Model([a, b], [h1, L.Average()([h3, h2])])
    randomize(m)
    r = _rng(8)
    return _keras_source(m, [r.standard_normal((2, 4)).astype(np.float32), r.standard_normal((2, 6)).astype(np.float32)])


def k3_subclassed() -> Source:
    import keras

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.d1 = keras.layers.Dense(12, activation="relu")
            self.norm = keras.layers.LayerNormalization()
            self.d2 = keras.layers.Dense(3)

        def call(self, x, training=False):
            return self.d2(self.norm(self.d1(x)) + 1.0)

    m = Net()
    x = _rng(9).standard_normal((2, 5)).astype(np.float32)
    m(x)
    randomize(m)
    src = _keras_source_subclassed(m, x)
    return src


def _keras_source_subclassed(m, x) -> Source:
    def run(key, feeds):
        return {"output_0": np.asarray(m(feeds["__first__"], training=False))}

    return Source("keras", m, {"serving_default": {"__first__": x}}, {"serving_default": run(None, {"__first__": x})},
                  run=run)


def k3_transformer() -> Source:
    import keras

    L = keras.layers
    x = keras.Input((6, 16), name="tokens")
    att = L.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    h = L.LayerNormalization()(L.Add()([x, att]))
    ff = L.Dense(16)(L.Dense(32, activation="gelu")(h))
    y = L.LayerNormalization()(L.Add()([h, ff]))
    m = keras.Model(x, L.GlobalAveragePooling1D()(y))
    randomize(m)
    return _keras_source(m, [_rng(10).standard_normal((2, 6, 16)).astype(np.float32)])


def k3_causal_attention() -> Source:
    """Decoder-style self-attention with Keras' causal mask (MatrixBandPart)."""
    import keras

    L = keras.layers
    x = keras.Input((6, 8), name="tokens")
    y = L.MultiHeadAttention(num_heads=2, key_dim=4)(x, x, use_causal_mask=True)
    m = keras.Model(x, L.Dense(3)(L.LayerNormalization()(L.Add()([x, y]))))
    randomize(m)
    return _keras_source(m, [_rng(20).standard_normal((2, 6, 8)).astype(np.float32)])


def k3_dynamic_sequence() -> Source:
    """Batch and sequence length both dynamic: reshape targets computed at run time."""
    import keras

    L = keras.layers
    x = keras.Input((None, 8), name="tokens")
    h = L.LayerNormalization()(L.Conv1D(4, 3, padding="same")(L.Dense(6, activation="relu")(x)))
    y = L.GlobalAveragePooling1D()(L.Add()([h, L.MultiHeadAttention(2, 4)(h, h)]))
    m = keras.Model(x, y)
    randomize(m)
    return _keras_source(m, [_rng(19).standard_normal((2, 5, 8)).astype(np.float32)])


def k3_mobilenet_v2() -> Source:
    import keras

    with contextlib.redirect_stdout(io.StringIO()):
        m = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    randomize(m, seed=11)
    # Keep activations in range: random BN statistics otherwise blow up through 17 blocks.
    for layer in m.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_variance.shape[0]
            layer.moving_variance.assign(np.full(n, 4.0, np.float32))
    return _keras_source(m, [_rng(11).uniform(0, 1, (1, 32, 32, 3)).astype(np.float32)])


def k3_conv3d() -> Source:
    import keras

    L = keras.layers
    m = _seq((6, 8, 8, 2), L.Conv3D(4, 3, padding="same", activation="relu"), L.Conv3D(3, 2),
             L.GlobalAveragePooling3D(), L.Dense(2))
    randomize(m)
    return _keras_source(m, [_rng(12).standard_normal((1, 6, 8, 8, 2)).astype(np.float32)])


def k3_gru_static() -> Source:
    """Keras 3 GRU with batch 1: the generic rnn while loop, TensorLists lowered."""
    import keras

    L = keras.layers
    m = _seq((5, 3), L.GRU(4, return_sequences=True), L.SimpleRNN(3), batch=1)
    randomize(m)
    return _keras_source(m, [_rng(13).standard_normal((1, 5, 3)).astype(np.float32)])


def k3_rnn_dynamic_batch() -> Source:
    import keras

    L = keras.layers
    m = _seq((5, 3), L.SimpleRNN(4, return_sequences=True), L.GRU(3))
    randomize(m)
    return _keras_source(m, [_rng(14).standard_normal((3, 5, 3)).astype(np.float32)], tf_fails=True,
                         note="TF's converter cannot lower TensorLists with a dynamic batch")


# -- fused LSTMs with a free batch (state variables sized at run time) ---------------------------

def k3_lstm() -> Source:
    import keras

    m = _seq((5, 4), keras.layers.LSTM(8))
    randomize(m)
    return _keras_source(m, [_rng(21).standard_normal((2, 5, 4)).astype(np.float32)], tf_fails=True,
                         note="TF's converter needs a static batch for LSTM")


def k3_lstm_stacked_states() -> Source:
    """Two stacked LSTMs, the second returning its final activation and cell state."""
    import keras

    L = keras.layers
    x = keras.Input((6, 3), name="seq")
    h = L.LSTM(8, return_sequences=True)(x)
    y, h_last, c_last = L.LSTM(5, return_state=True)(h)
    m = keras.Model(x, [y, h_last, c_last])
    randomize(m)
    return _keras_source(m, [_rng(22).standard_normal((2, 6, 3)).astype(np.float32)], tf_fails=True,
                         note="TF's converter needs a static batch for LSTM")


def k3_bilstm() -> Source:
    import keras

    L = keras.layers
    m = _seq((6, 3), L.Bidirectional(L.LSTM(5, return_sequences=True)),
             L.Bidirectional(L.LSTM(4), merge_mode="sum"))
    randomize(m)
    return _keras_source(m, [_rng(23).standard_normal((2, 6, 3)).astype(np.float32)], tf_fails=True,
                         note="TF's converter needs a static batch for LSTM")


def k3_lstm_initial_state() -> Source:
    """An LSTM whose initial state is computed from a second input (encoder-decoder style)."""
    import keras

    L = keras.layers
    seq = keras.Input((6, 3), name="seq")
    ctx = keras.Input((4,), name="ctx")
    h0, c0 = L.Dense(7, activation="tanh")(ctx), L.Dense(7)(ctx)
    m = keras.Model([seq, ctx], L.LSTM(7, return_sequences=True)(seq, initial_state=[h0, c0]))
    randomize(m)
    r = _rng(24)
    return _keras_source(m, [r.standard_normal((2, 6, 3)).astype(np.float32),
                             r.standard_normal((2, 4)).astype(np.float32)], tf_fails=True,
                         note="TF's converter needs a static batch for LSTM")


def k3_conv1d_lstm() -> Source:
    """A text model: Embedding, Conv1D, LSTM, Dense."""
    import keras

    L = keras.layers
    m = _seq((12,), L.Embedding(50, 8), L.Conv1D(8, 3, activation="relu"), L.MaxPooling1D(2),
             L.LSTM(6), L.Dense(2))
    randomize(m)
    return _keras_source(m, [_rng(25).integers(0, 50, (2, 12)).astype(np.float32)], tf_fails=True,
                         note="TF's converter needs a static batch for LSTM")


def tfk_lstm() -> Source:
    import tf_keras

    L = tf_keras.layers
    m = tf_keras.Sequential([L.InputLayer((5, 3), name="seq"), L.LSTM(6, return_sequences=True),
                             L.LSTM(4, name="last")])
    randomize(m)
    src = _tf_keras_source(m, [_rng(26).standard_normal((2, 5, 3)).astype(np.float32)])
    src.tf_fails, src.note = True, "TF's converter needs a static batch for LSTM"
    return src


# -- tf_keras ------------------------------------------------------------------------------------

def tfk_cnn() -> Source:
    import tf_keras

    L = tf_keras.layers
    m = tf_keras.Sequential([
        L.InputLayer((12, 12, 3), name="image"), L.Conv2D(6, 3, activation="relu"), L.BatchNormalization(),
        L.MaxPooling2D(), L.Conv2D(4, 3, padding="same", activation="relu6"), L.Flatten(),
        L.Dense(5, activation="softmax", name="probs")])
    randomize(m)
    return _tf_keras_source(m, [_rng(15).standard_normal((2, 12, 12, 3)).astype(np.float32)])


def tfk_functional() -> Source:
    import tf_keras

    L = tf_keras.layers
    a = L.Input((5,), name="left")
    b = L.Input((5,), name="right")
    h = L.Dense(8, activation="gelu")(L.Concatenate()([a, b]))
    m = tf_keras.Model([a, b], [L.Dense(2, name="score")(h), L.Dense(3, activation="softmax", name="label")(h)])
    randomize(m)
    r = _rng(16)
    return _tf_keras_source(m, [r.standard_normal((2, 5)).astype(np.float32), r.standard_normal((2, 5)).astype(np.float32)])


# -- tf.function / tf.Module -------------------------------------------------------------------

def _fn_source(fn, feeds: dict[str, np.ndarray], trackable=None, *, tf_fails=False, note="") -> Source:
    cf = fn.get_concrete_function()

    def run(key, values):
        out = cf(**{k: _tf().constant(v) for k, v in values.items()})
        if isinstance(out, dict):
            return {k: np.asarray(v) for k, v in out.items()}
        outs = out if isinstance(out, (list, tuple)) else [out]
        return {f"output_{i}": np.asarray(v) for i, v in enumerate(outs)}

    return Source("functions", [cf], {"serving_default": feeds}, {"serving_default": run(None, feeds)},
                  trackable=trackable, tf_fails=tf_fails, note=note, run=run)


def fn_control_flow() -> Source:
    tf = _tf()

    class Flow(tf.Module):
        def __init__(self):
            self.w = tf.Variable(np.linspace(-1, 1, 4).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([4], tf.float32, name="x"), tf.TensorSpec([], tf.int32, name="n")])
        def __call__(self, x, n):
            i = tf.constant(0)
            y = x
            while i < n:
                y = y * 0.5 + self.w
                i += 1
            if tf.reduce_sum(y) > 1.0:
                y = tf.nn.relu(y - 1.0)
            else:
                y = y * 2.0 + 1.0
            return {"y": y, "steps": i}

    m = Flow()
    return _fn_source(m.__call__, {"x": np.array([1, 2, 3, 4], np.float32), "n": np.array(3, np.int32)}, m)


def fn_switch_case() -> Source:
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([3], tf.float32, name="x"), tf.TensorSpec([], tf.int32, name="k")])
    def f(x, k):
        return tf.switch_case(k, [lambda: x * 2.0, lambda: x - 1.0, lambda: tf.exp(x)])

    return _fn_source(f, {"x": np.array([0.5, 1, 2], np.float32), "k": np.array(1, np.int32)}, tf_fails=True,
                      note="TF's converter has no legalisation for Case")


def fn_tensor_array() -> Source:
    tf = _tf()

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def f(x):
        ta = tf.TensorArray(tf.float32, size=4, element_shape=[None, 3])
        h = tf.zeros_like(x)
        for t in tf.range(4):
            h = tf.tanh(h * 0.5 + x * tf.cast(t, tf.float32))
            ta = ta.write(t, h)
        return ta.stack()

    return _fn_source(f, {"x": _rng(17).standard_normal((2, 3)).astype(np.float32)}, tf_fails=True,
                      note="TF's converter cannot lower a TensorList with an unknown element dim")


def fn_einsum() -> Source:
    tf = _tf()
    r = _rng(18)
    w = tf.constant(r.standard_normal((5, 2, 3)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 5], tf.float32, name="a"),
                                  tf.TensorSpec([None, 4, 6], tf.float32, name="b")])
    def f(a, b):
        p = tf.einsum("btk,kcd->btcd", a, w)
        q = tf.einsum("btk,btj->bkj", a, b)
        s = tf.einsum("bij->bji", q)
        return p, tf.einsum("bij,bkj->bik", s, s), tf.einsum("bij->b", q)

    return _fn_source(f, {"a": r.standard_normal((2, 4, 5)).astype(np.float32),
                          "b": r.standard_normal((2, 4, 6)).astype(np.float32)})


def sm_variables() -> Source:
    """A SavedModel with a counter the model assigns (resource variables) and a read-only
    weight (folded to a constant); two signatures."""
    tf = _tf()

    class Counter(tf.Module):
        def __init__(self):
            self.count = tf.Variable(0.0)
            self.w = tf.Variable([1.0, -2.0, 0.5])

        @tf.function(input_signature=[tf.TensorSpec([3], tf.float32, name="inp")])
        def step(self, x):
            self.count.assign_add(1.0)
            return {"out": x * self.w + self.count}

        @tf.function(input_signature=[])
        def read(self):
            return {"count": self.count.read_value()}

    m = Counter()
    path = tempfile.mkdtemp(prefix="kiln_zoo_sm_")
    tf.saved_model.save(m, path, signatures={"step": m.step, "read": m.read})
    fresh = Counter()
    x = np.array([1, 2, 3], np.float32)
    ref = {"out": fresh.step(x)["out"].numpy()}
    return Source("saved_model", path, {"step": {"inp": x}}, {"step": ref},
                  note="one step from a fresh state")


#: Zoo model name -> builder.
BUILDERS: dict[str, Callable[[], Source]] = {
    "k3_mlp": k3_mlp,
    "k3_activations": k3_activations,
    "k3_gelu_shared": k3_gelu_shared,
    "k3_cnn": k3_cnn,
    "k3_separable": k3_separable,
    "k3_dilated": k3_dilated,
    "k3_shared_conv_relu": k3_shared_conv_relu,
    "k3_squeeze_excite": k3_squeeze_excite,
    "k3_attention_fresh": k3_attention_fresh,
    "k3_conv1d_embedding": k3_conv1d_embedding,
    "k3_shapes": k3_shapes,
    "k3_multi_io": k3_multi_io,
    "k3_subclassed": k3_subclassed,
    "k3_transformer": k3_transformer,
    "k3_causal_attention": k3_causal_attention,
    "k3_dynamic_sequence": k3_dynamic_sequence,
    "k3_mobilenet_v2": k3_mobilenet_v2,
    "k3_gru_static": k3_gru_static,
    "k3_rnn_dynamic_batch": k3_rnn_dynamic_batch,
    "k3_lstm": k3_lstm,
    "k3_lstm_stacked_states": k3_lstm_stacked_states,
    "k3_bilstm": k3_bilstm,
    "k3_lstm_initial_state": k3_lstm_initial_state,
    "k3_conv1d_lstm": k3_conv1d_lstm,
    "tfk_lstm": tfk_lstm,
    "tfk_cnn": tfk_cnn,
    "tfk_functional": tfk_functional,
    "fn_control_flow": fn_control_flow,
    "fn_switch_case": fn_switch_case,
    "fn_tensor_array": fn_tensor_array,
    "fn_einsum": fn_einsum,
    "sm_variables": sm_variables,
}
#: The ImageNet-size model: its cases run in the slow lane (seconds each in TF and both runtimes).
SLOW = {"k3_mobilenet_v2"}


def params(names) -> list:
    """``names`` as pytest parameters, the SLOW ones marked slow."""
    import pytest

    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


def kiln_converter(src: Source):
    import kiln

    if src.kind == "keras":
        return kiln.TFLiteConverter.from_keras_model(src.obj)
    if src.kind == "functions":
        return kiln.TFLiteConverter.from_concrete_functions(src.obj, src.trackable)
    return kiln.TFLiteConverter.from_saved_model(src.obj, signature_keys=sorted(_saved_keys(src.obj)))


def tf_converter(src: Source):
    tf = _tf()
    if src.kind == "keras":
        return tf.lite.TFLiteConverter.from_keras_model(src.obj)
    if src.kind == "functions":
        return tf.lite.TFLiteConverter.from_concrete_functions(src.obj, src.trackable)
    return tf.lite.TFLiteConverter.from_saved_model(src.obj, signature_keys=sorted(_saved_keys(src.obj)))


def _saved_keys(path) -> list[str]:
    return list(_tf().saved_model.load(path).signatures)


def convert_kiln(src: Source) -> tuple[bytes, Any, float]:
    """kiln's conversion, timed from converter creation (tracing included) to bytes."""
    start = time.perf_counter()
    conv = kiln_converter(src)
    data = conv.convert()
    return data, conv.report, time.perf_counter() - start


@contextlib.contextmanager
def _silent_fd2():
    """Silence TF's C++ logging (written straight to file descriptor 2)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def convert_tf(src: Source) -> tuple[bytes | None, float, str]:
    """TF's conversion, timed the same way; (None, seconds, error) when it fails."""
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _silent_fd2():
            data = tf_converter(src).convert()
    except Exception as exc:  # noqa: BLE001 - TF raises many kinds; recorded for the test
        return None, time.perf_counter() - start, f"{type(exc).__name__}: {str(exc)[:300]}"
    return data, time.perf_counter() - start, ""


@functools.lru_cache(maxsize=None)
def case(name: str) -> Case:
    """Build, convert (kiln and TF) and cache one zoo model for the session."""
    src = BUILDERS[name]()
    data, report, seconds = convert_kiln(src)
    tf_data, tf_seconds, tf_error = convert_tf(src)
    return Case(name, src, data, report, seconds, tf_data, tf_seconds, tf_error)


def op_pairs(model: bytes) -> set[tuple[str, int]]:
    """(op name, version) pairs of a .tflite (custom ops by custom code)."""
    import kiln

    m = kiln.read_model(model)
    return {(op.name, op.version) for _, _, op in m.operators()}


def op_count(model: bytes) -> int:
    import kiln

    return sum(1 for _ in kiln.read_model(model).operators())


def run_macs(model: bytes, key: str, feeds: dict) -> int:
    """Multiply-accumulates of ``model`` at the shapes a run of signature ``key`` on ``feeds``
    produces (stored dynamic dims are placeholders, so static shapes would not compare)."""
    import kiln
    from kiln.passes.cost import model_macs

    interp = kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    if key in interp.get_signature_list():
        if "__first__" in feeds:
            (name,) = interp.get_signature_list()[key]["inputs"]
            feeds = {name: feeds["__first__"]}
        interp.get_signature_runner(key)(**feeds)
    else:  # a model without signatures (TF's conversion of concrete functions): inputs in order
        for d, value in zip(interp.get_input_details(), feeds.values()):
            interp.resize_tensor_input(d["index"], np.shape(value))
        interp.allocate_tensors()
        for d, value in zip(interp.get_input_details(), feeds.values()):
            interp.set_tensor(d["index"], np.asarray(value))
        interp.invoke()
    shapes = {}
    for s, sg in enumerate(interp.model.subgraphs):
        for i, t in enumerate(sg.tensors):
            try:
                shapes[id(t)] = interp.get_tensor(i, s).shape
            except Exception:  # noqa: BLE001 - a tensor no run wrote keeps its stored shape
                continue
    return model_macs(interp.model, shapes)
