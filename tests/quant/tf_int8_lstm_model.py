"""Writes TF's own full-integer tf_keras LSTM models (tf.lite.TFLiteConverter with a
representative dataset): ``python -m tests.quant.tf_int8_lstm_model OUT_DIR``. TF's
converter can crash the process (it segfaults calibrating Keras 3 LSTMs), so tests run it in
a subprocess. Writes ``calib16.tflite`` (16 calibration samples: TF's cell scale 2^-16) and
``calib64.tflite`` (64 samples: a coarser cell scale)."""

from __future__ import annotations

import os
import sys

from tests.quant.zoo_models import FEATURES, T, lstm_inputs


def build(samples: int) -> bytes:
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    L = tf_keras.layers
    m = tf_keras.Sequential([L.InputLayer((T, FEATURES), batch_size=1), L.LSTM(12, return_sequences=True), L.Dense(3)])
    data = lstm_inputs(samples, 0)
    conv = tf.lite.TFLiteConverter.from_keras_model(m)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([d] for d in data)
    return conv.convert()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = sys.argv[1]
    for samples in (16, 64):
        with open(os.path.join(out, f"calib{samples}.tflite"), "wb") as f:
            f.write(build(samples))
