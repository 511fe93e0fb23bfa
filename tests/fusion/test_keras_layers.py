"""prepare_keras_model: Keras 3 / tf_keras recurrent layers traced as composites."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.converter.keras import prepare_keras_model

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf_keras = pytest.importorskip("tf_keras")

LIBS = {"keras3": keras, "tf_keras": tf_keras}
B, T, I = 2, 5, 3


def _composites(concrete) -> dict:
    """implements name -> [attrs] of the composite functions in a traced graph."""
    found: dict = {}
    for f in concrete.graph.as_graph_def().library.function:
        if "_implements" in f.attr:
            func = f.attr["_implements"].func
            attrs = {k: getattr(v, v.WhichOneof("value")) for k, v in func.attr.items()}
            found.setdefault(func.name, []).append(attrs)
    return found


def _trace(model, shape=(None, T, I)):
    fn = tf.function(lambda x: model(x, training=False), autograph=False)
    return fn.get_concrete_function(tf.TensorSpec(shape, tf.float32))


def _model(lib):
    inp = lib.Input((T, I))
    y = lib.layers.LSTM(4, return_sequences=True, name="lstm_a")(inp)
    y = lib.layers.Bidirectional(lib.layers.LSTM(3, return_sequences=True), merge_mode="ave",
                                 name="bidi")(y)
    y = lib.layers.LSTM(3, return_sequences=True, recurrent_activation="hard_sigmoid",
                        name="lstm_hard")(y)
    y = lib.layers.GRU(3, return_sequences=True, name="gru")(y)
    y, h, c = lib.layers.LSTM(2, go_backwards=True, return_state=True, activation="relu",
                              name="lstm_back")(y)
    return lib.Model(inp, [y, h, c])


@pytest.mark.parametrize("lib", list(LIBS))
def test_layers_become_composites_with_the_same_outputs(lib):
    model = _model(LIBS[lib])
    x = np.random.default_rng(0).standard_normal((B, T, I)).astype(np.float32)
    want = [np.asarray(t) for t in model(x)]
    with prepare_keras_model(model) as report:
        concrete = _trace(model)
    got = [t.numpy() for t in concrete(tf.constant(x))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-6)
    found = _composites(concrete)
    assert sorted(a["layer"].decode() for a in found["kiln_keras_lstm"]) == ["lstm_a", "lstm_back"]
    (bidi,) = found["kiln_keras_bidirectional_lstm"]
    assert bidi["merge_mode"] == b"ave" and bidi["return_sequences"] is True
    back = [a for a in found["kiln_keras_lstm"] if a["layer"] == b"lstm_back"][0]
    assert back["go_backwards"] is True and back["activation"] == b"relu"
    lines = report.lines()
    assert "lstm_a: LSTM wrapped as kiln_keras_lstm" in lines
    assert "bidi: Bidirectional(LSTM) wrapped as kiln_keras_bidirectional_lstm" in lines
    assert ("lstm_hard: not fused: recurrent_activation='hard_sigmoid' is not expressible in "
            "UNIDIRECTIONAL_SEQUENCE_LSTM (its gates are always sigmoid)") in lines
    assert "gru: not fused: LiteRT has no fused GRU op; the GRU is converted as a loop" in lines
    # restored on exit
    assert all("call" not in vars(layer) for layer in model.layers)


@pytest.mark.parametrize("lib", list(LIBS))
def test_masked_layers_fall_back_to_their_own_code(lib):
    k = LIBS[lib]
    inp = k.Input((T, I))
    y = k.layers.Masking(0.0)(inp)
    y = k.layers.LSTM(4, name="masked")(y)
    model = k.Model(inp, y)
    x = np.random.default_rng(1).standard_normal((B, T, I)).astype(np.float32)
    x[0, 3:] = 0.0
    with prepare_keras_model(model) as report:
        concrete = _trace(model)
    np.testing.assert_allclose(concrete(tf.constant(x)).numpy(), np.asarray(model(x)), atol=1e-6)
    assert "kiln_keras_lstm" not in _composites(concrete)
    assert report.lines() == ["masked: not fused: a mask or ragged input reaches the layer; "
                              "UNIDIRECTIONAL_SEQUENCE_LSTM has no mask operand"]


def test_stateful_layer_traces_without_state_assignments():
    inp = keras.Input((T, I), batch_size=B)
    model = keras.Model(inp, keras.layers.LSTM(4, stateful=True, name="s")(inp))
    with prepare_keras_model(model):
        concrete = _trace(model, (B, T, I))
    ops = {op.type for op in concrete.graph.get_operations()}
    assert "AssignVariableOp" not in ops
    (attrs,) = _composites(concrete)["kiln_keras_lstm"]
    assert attrs["stateful"] is True


def test_unequal_bidirectional_directions_use_two_layers():
    k = keras
    inp = k.Input((T, I))
    bi = k.layers.Bidirectional(k.layers.LSTM(3, return_sequences=True),
                                backward_layer=k.layers.LSTM(5, return_sequences=True,
                                                             go_backwards=True), name="bi")
    model = k.Model(inp, bi(inp))
    with prepare_keras_model(model) as report:
        concrete = _trace(model)
    assert len(_composites(concrete)["kiln_keras_lstm"]) == 2
    assert report.lines()[0].startswith("bi: not fused: not one BIDIRECTIONAL_SEQUENCE_LSTM: the "
                                        "two directions have different sizes")


def test_nested_models_are_searched():
    inner = keras.Sequential([keras.Input((T, I)), keras.layers.LSTM(4, name="inner_lstm")])
    outer = keras.Sequential([keras.Input((T, I)), inner, keras.layers.Dense(1)])
    with prepare_keras_model(outer) as report:
        concrete = _trace(outer)
    assert report.lines() == ["inner_lstm: LSTM wrapped as kiln_keras_lstm"]
    assert "kiln_keras_lstm" in _composites(concrete)


def test_rnn_over_an_lstm_cell_is_an_lstm():
    model = keras.Sequential([keras.Input((T, I)),
                              keras.layers.RNN(keras.layers.LSTMCell(4), return_sequences=True,
                                               name="rnn")])
    x = np.random.default_rng(2).standard_normal((B, T, I)).astype(np.float32)
    with prepare_keras_model(model) as report:
        concrete = _trace(model)
    assert report.lines() == ["rnn: RNN(LSTMCell) wrapped as kiln_keras_lstm"]
    np.testing.assert_allclose(concrete(tf.constant(x)).numpy(), np.asarray(model(x)), atol=1e-6)
