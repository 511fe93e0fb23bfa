"""Bidirectional(LSTM) -> ONE BIDIRECTIONAL_SEQUENCE_LSTM (TensorFlow's converter emits two
unidirectional LSTMs, a REVERSE_V2 and a CONCATENATION)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.fusion.registry import NotFusable
from tests.fusion.util import In, check_both, composite_model, op_names
from tests.harness import Const

keras = pytest.importorskip("keras")
tf_keras = pytest.importorskip("tf_keras")
tf = pytest.importorskip("tensorflow")

B, T, I = 2, 5, 3
H_FW = 4


def _layer(lib, merge_mode, return_sequences, units_bw=H_FW, activation="tanh", **kw):
    fw = lib.layers.LSTM(H_FW, return_sequences=return_sequences, return_state=True,
                         activation=activation, **kw)
    bw = lib.layers.LSTM(units_bw, return_sequences=return_sequences, return_state=True,
                         activation=activation, go_backwards=True, **kw)
    layer = lib.layers.Bidirectional(fw, backward_layer=bw, merge_mode=merge_mode)
    layer.build((None, T, I))
    rng = np.random.default_rng(7)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                       for w in layer.get_weights()])
    return layer


def _args(layer, x, states=None):
    out = [In(x)]
    for k, sub in enumerate((layer.forward_layer, layer.backward_layer)):
        cell = sub.cell
        units = cell.units
        h0 = np.zeros((x.shape[0], units), np.float32) if states is None else states[2 * k]
        c0 = np.zeros((x.shape[0], units), np.float32) if states is None else states[2 * k + 1]
        out += [Const(h0) if states is None else In(h0), Const(c0) if states is None else In(c0),
                Const(np.asarray(cell.kernel)), Const(np.asarray(cell.recurrent_kernel)),
                Const(np.asarray(cell.bias))]
    return out


def _attrs(merge_mode, return_sequences, activation="tanh"):
    return {"layer": "bidirectional", "merge_mode": "none" if merge_mode is None else merge_mode,
            "return_sequences": return_sequences, "forward_activation": activation,
            "backward_activation": activation}


@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
@pytest.mark.parametrize("return_sequences", [True, False])
def test_merge_modes(merge_mode, return_sequences):
    layer = _layer(keras, merge_mode, return_sequences)
    x = np.random.default_rng(8).standard_normal((B, T, I)).astype(np.float32)
    expected = [np.asarray(t) for t in layer(x)]  # merged output(s), h_fw, c_fw, h_bw, c_bw
    n = len(expected)
    built = composite_model("kiln_keras_bidirectional_lstm", _attrs(merge_mode, return_sequences),
                            _args(layer, x), n)
    names = op_names(built.model)
    assert names.count("BIDIRECTIONAL_SEQUENCE_LSTM") == 1
    assert "UNIDIRECTIONAL_SEQUENCE_LSTM" not in names and "WHILE" not in names
    check_both(built.model, built.feeds, expected)


def test_tf_keras_time_major_with_initial_states():
    """tf_keras layer, time-major input (the op merges the outputs itself), states fed in."""
    layer = _layer(tf_keras, "concat", True, time_major=True)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    states = [rng.standard_normal((B, H_FW)).astype(np.float32) for _ in range(4)]
    expected = [t.numpy() for t in layer(x, initial_state=[tf.constant(s) for s in states])]
    attrs = {**_attrs("concat", True), "time_major": True}
    built = composite_model("kiln_keras_bidirectional_lstm", attrs, _args(layer, x, states), 5)
    assert "CONCATENATION" not in op_names(built.model)  # time-major: the op merges itself
    check_both(built.model, built.feeds, expected)


def test_relu_activation():
    layer = _layer(keras, "concat", False, activation="relu")
    x = np.random.default_rng(10).standard_normal((B, T, I)).astype(np.float32)
    expected = [np.asarray(t) for t in layer(x)]
    built = composite_model("kiln_keras_bidirectional_lstm", _attrs("concat", False, "relu"),
                            _args(layer, x), 5)
    check_both(built.model, built.feeds, expected)


def test_mixed_activations_are_refused():
    layer = _layer(keras, "concat", True)
    x = np.zeros((B, T, I), np.float32)
    attrs = {**_attrs("concat", True), "backward_activation": "relu"}
    with pytest.raises(NotFusable, match="bidirectional: not fused: the forward and backward"):
        composite_model("kiln_keras_bidirectional_lstm", attrs, _args(layer, x), 5)


def test_directions_of_different_sizes_are_refused():
    """LiteRT checks the backward weights against the forward sizes (prepare fails)."""
    layer = _layer(keras, "concat", True, units_bw=6)
    x = np.zeros((B, T, I), np.float32)
    with pytest.raises(NotFusable, match="both directions need the same number of units"):
        composite_model("kiln_keras_bidirectional_lstm", _attrs("concat", True), _args(layer, x), 5)
