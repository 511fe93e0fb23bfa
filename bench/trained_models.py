"""Small models trained to real accuracy on data shipped with scikit-learn (no download), for
bench/quant_bench.py's trained-model table: kiln's and TF's quantized models compared by
accuracy and SQNR, per mode.

Each builder returns a `Trained`: the Keras model, calibration samples (training rows) and a
held-out split with labels. Seeds are fixed, so runs compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class Trained:
    name: str
    model: Any                 # a Keras 3 or tf_keras model
    calibration: list          # [sample (1, ...) float32]
    x_test: np.ndarray
    y_test: np.ndarray
    keras3: bool = True        # TF's converter segfaults calibrating Keras 3 recurrent layers


def _digits(seed: int = 0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.images / 16.0).astype(np.float32), d.target
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], y[order]


def _split(x, y, n_train):
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _table(loader, seed=0):
    from sklearn.preprocessing import StandardScaler

    d = loader()
    x, y = d.data.astype(np.float32), d.target
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n = int(0.7 * len(x))
    scaler = StandardScaler().fit(x[:n])
    return _split(scaler.transform(x).astype(np.float32), y, n)


def _fit(model, x, y, epochs, keras):
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return model


def _calibration(x, count=100):
    return [x[i:i + 1] for i in range(min(count, len(x)))]


def digits_cnn() -> Trained:
    import keras

    keras.utils.set_random_seed(0)
    x, y = _digits()
    xtr, ytr, xte, yte = _split(x[..., None], y, 1400)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(16, 3, padding="same", activation="relu"), L.MaxPooling2D(),
                          L.Conv2D(32, 3, padding="same", activation="relu"), L.GlobalAveragePooling2D(),
                          L.Dense(10, activation="softmax")])
    return Trained("digits CNN", _fit(m, xtr, ytr, 20, keras), _calibration(xtr), xte, yte)


def digits_hard_swish() -> Trained:
    import keras

    keras.utils.set_random_seed(1)
    x, y = _digits()
    xtr, ytr, xte, yte = _split(x[..., None], y, 1400)
    L = keras.layers
    m = keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(16, 3, padding="same", activation="hard_swish"),
                          L.DepthwiseConv2D(3, padding="same", activation="hard_swish"), L.Flatten(),
                          L.Dense(10, activation="softmax")])
    return Trained("hard-swish CNN", _fit(m, xtr, ytr, 20, keras), _calibration(xtr), xte, yte)


def _mlp(name: str, loader, seed: int) -> Trained:
    import keras

    keras.utils.set_random_seed(seed)
    xtr, ytr, xte, yte = _table(loader, seed)
    L = keras.layers
    classes = int(ytr.max()) + 1
    m = keras.Sequential([keras.Input((xtr.shape[1],)), L.Dense(32, activation="relu"), L.Dense(16, activation="relu"),
                          L.Dense(classes, activation="softmax")])
    return Trained(name, _fit(m, xtr, ytr, 60, keras), _calibration(xtr), xte, yte)


def wine_mlp() -> Trained:
    from sklearn.datasets import load_wine

    return _mlp("wine MLP", load_wine, 2)


def cancer_mlp() -> Trained:
    from sklearn.datasets import load_breast_cancer

    return _mlp("breast-cancer MLP", load_breast_cancer, 3)


def digits_transformer() -> Trained:
    """The digits as 8 rows of 8 pixels: one attention block with LayerNormalization."""
    import keras

    keras.utils.set_random_seed(4)
    x, y = _digits()
    xtr, ytr, xte, yte = _split(x, y, 1400)
    L = keras.layers
    inp = keras.Input((8, 8))
    h = L.Dense(16)(inp)
    h = L.LayerNormalization()(h + L.MultiHeadAttention(2, 8)(h, h))
    h = L.LayerNormalization()(h + L.Dense(16)(L.Dense(32, activation="relu")(h)))
    m = keras.Model(inp, L.Dense(10, activation="softmax")(L.GlobalAveragePooling1D()(h)))
    return Trained("digits transformer", _fit(m, xtr, ytr, 25, keras), _calibration(xtr), xte, yte)


def _recurrent(name: str, layer: str, seed: int) -> Trained:
    import keras

    keras.utils.set_random_seed(seed)
    x, y = _digits()
    xtr, ytr, xte, yte = _split(x, y, 1400)
    L = keras.layers
    rnn = L.LSTM(24) if layer == "lstm" else L.GRU(24)
    m = keras.Sequential([keras.Input((8, 8), batch_size=1), rnn, L.Dense(10, activation="softmax")])
    _fit(m, xtr, ytr, 20, keras)
    return Trained(name, m, _calibration(xtr), xte, yte)


def digits_lstm() -> Trained:
    return _recurrent("digits LSTM (Keras 3)", "lstm", 5)


def digits_gru() -> Trained:
    return _recurrent("digits GRU (Keras 3)", "gru", 6)


def digits_lstm_tf_keras() -> Trained:
    import tf_keras

    tf_keras.utils.set_random_seed(7)
    x, y = _digits()
    xtr, ytr, xte, yte = _split(x, y, 1400)
    L = tf_keras.layers

    def build(batch_size):   # trained at any batch size; converted at batch 1 (TF fuses the LSTM then)
        return tf_keras.Sequential([L.InputLayer((8, 8), batch_size=batch_size), L.LSTM(24),
                                    L.Dense(10, activation="softmax")])

    trained = _fit(build(None), xtr, ytr, 20, tf_keras)
    m = build(1)
    m.set_weights(trained.get_weights())
    return Trained("digits LSTM (tf_keras)", m, _calibration(xtr), xte, yte, keras3=False)


MODELS: dict[str, Callable[[], Trained]] = {
    "digits_cnn": digits_cnn, "hard_swish": digits_hard_swish, "wine": wine_mlp, "cancer": cancer_mlp,
    "transformer": digits_transformer, "lstm": digits_lstm, "gru": digits_gru, "lstm_tf_keras": digits_lstm_tf_keras,
}
