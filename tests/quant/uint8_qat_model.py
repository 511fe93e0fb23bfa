"""Writes a uint8 model as TF1's quantization-aware converter makes it (fake-quant nodes,
``inference_type=uint8``): CONV_2D + RELU6, DEPTHWISE_CONV_2D, RESHAPE, FULLY_CONNECTED.

Run as a script (``python -m tests.quant.uint8_qat_model OUT.tflite``): it switches
TensorFlow to graph mode, so tests run it in a subprocess."""

from __future__ import annotations

import os
import sys

import numpy as np


def build() -> bytes:
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    rng = np.random.default_rng(0)

    def fq(t, lo, hi, name=None):
        return tf.quantization.fake_quant_with_min_max_args(t, lo, hi, name=name)

    def const(*shape, limit):
        return tf.constant(rng.uniform(-limit, limit, shape).astype(np.float32))

    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, (1, 8, 8, 3), name="x")
        h = tf.nn.relu6(tf.nn.conv2d(fq(x, -1.0, 1.0), fq(const(3, 3, 3, 4, limit=0.5), -0.5, 0.5), 1, "SAME")
                        + const(4, limit=0.1))
        h = fq(h, 0.0, 6.0)
        h = tf.nn.depthwise_conv2d(h, fq(const(3, 3, 4, 1, limit=0.5), -0.5, 0.5), [1, 2, 2, 1], "VALID") \
            + const(4, limit=0.1)
        f = tf.reshape(fq(h, -4.0, 4.0), (1, -1))
        y = tf.matmul(f, fq(const(int(f.shape[1]), 5, limit=0.3), -0.3, 0.3)) + const(5, limit=0.1)
        y = fq(y, -8.0, 8.0, name="y")
        with tf1.Session(graph=graph) as session:
            converter = tf1.lite.TFLiteConverter.from_session(session, [x], [y])
            converter.inference_type = tf.uint8
            converter.quantized_input_stats = {"x": (127.5, 127.5)}
            return converter.convert()


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with open(sys.argv[1], "wb") as f:
        f.write(build())
