"""End to end through kiln's converter: Keras models -> fused LSTM ops, no WHILE, outputs equal
to TensorFlow's within 1e-5 in LiteRT and in kiln (on a first and a second invocation)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fusion.util import B, I, T, check_both, op_names, randomized, sequence_input

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf_keras = pytest.importorskip("tf_keras")



def convert_keras(model):
    import kiln

    converter = kiln.TFLiteConverter.from_keras_model(model)
    return converter.convert(), converter.report


def _check(model, xs, *, fused, lib=keras):
    data, report = convert_keras(model)
    names = op_names(data)
    assert "WHILE" not in names, names
    for op, count in fused.items():
        assert names.count(op) == count, (op, names)
    want = model(xs if len(xs) > 1 else xs[0])
    want = [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]
    check_both(data, xs, want)
    return report


def test_lstm_return_sequences():
    model = randomized(keras.Sequential([keras.Input((T, I)),
                                         keras.layers.LSTM(4, return_sequences=True)]))
    report = _check(model, [sequence_input()], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 1})
    assert any("fused into UNIDIRECTIONAL_SEQUENCE_LSTM" in line for line in report.fused)


def test_stacked_lstm_last_output():
    model = randomized(keras.Sequential([
        keras.Input((T, I)), keras.layers.LSTM(5, return_sequences=True),
        keras.layers.LSTM(4, return_sequences=True), keras.layers.LSTM(3)]))
    _check(model, [sequence_input()], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 3})


@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
def test_bidirectional_is_one_op(merge_mode):
    inp = keras.Input((T, I))
    out = keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True),
                                     merge_mode=merge_mode)(inp)
    model = randomized(keras.Model(inp, out))
    _check(model, [sequence_input()], fused={"BIDIRECTIONAL_SEQUENCE_LSTM": 1, "UNIDIRECTIONAL_SEQUENCE_LSTM": 0})


def test_embedding_then_lstm():
    inp = keras.Input((T,), dtype="int32")
    y = keras.layers.Embedding(20, 5)(inp)
    y = keras.layers.LSTM(4)(y)
    model = randomized(keras.Model(inp, keras.layers.Dense(2)(y)))
    ids = np.random.default_rng(2).integers(0, 20, (B, T)).astype(np.int32)
    _check(model, [ids], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 1})


def test_go_backwards_and_return_state():
    inp = keras.Input((T, I))
    y, h, c = keras.layers.LSTM(4, go_backwards=True, return_sequences=True,
                                return_state=True)(inp)
    model = randomized(keras.Model(inp, [y, h, c]))
    names = op_names(convert_keras(model)[0])
    assert "REVERSE_V2" in names
    _check(model, [sequence_input()], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 1})


def test_encoder_states_feed_a_decoder():
    enc_in, dec_in = keras.Input((T, I)), keras.Input((4, I))
    _, h, c = keras.layers.LSTM(5, return_state=True)(enc_in)
    dec = keras.layers.LSTM(5, return_sequences=True)(dec_in, initial_state=[h, c])
    model = randomized(keras.Model([enc_in, dec_in], dec))
    _check(model, [sequence_input(), sequence_input((B, 4, I), seed=3)], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 2})


def test_tf_keras_time_major_and_bidirectional():
    inp = tf_keras.Input((B, I), batch_size=T)  # time-major: [time, batch, features]
    y = tf_keras.layers.LSTM(4, time_major=True, return_sequences=True)(inp)
    y = tf_keras.layers.Bidirectional(tf_keras.layers.LSTM(3, time_major=True,
                                                           return_sequences=True))(y)
    model = randomized(tf_keras.Model(inp, y))
    _check(model, [sequence_input((T, B, I))], fused={"UNIDIRECTIONAL_SEQUENCE_LSTM": 1,
                                          "BIDIRECTIONAL_SEQUENCE_LSTM": 1}, lib=tf_keras)


def test_unfusable_layers_are_loops_and_reported():
    inp = keras.Input((T, I), batch_size=B)
    y = keras.layers.LSTM(3, return_sequences=True, recurrent_activation="hard_sigmoid",
                          name="lstm_hard")(inp)
    y = keras.layers.GRU(3, return_sequences=True, name="gru")(y)
    y = keras.layers.SimpleRNN(3, name="simple")(y)
    model = randomized(keras.Model(inp, y))
    data, report = convert_keras(model)
    assert op_names(data).count("WHILE") == 3
    text = "\n".join(report.notes + report.not_fused)
    assert "lstm_hard: not fused: recurrent_activation='hard_sigmoid' is not expressible" in text
    assert "gru: not fused: LiteRT has no fused GRU op" in text
    assert "simple: not fused: SimpleRNN is converted as a loop" in text
    check_both(data, [sequence_input()], [np.asarray(model(sequence_input()))])


def test_stateful_lstm_in_chunks_matches_the_whole_sequence():
    from kiln.runtime import Interpreter as KilnInterpreter
    from tests.fusion.util import invoke, litert
    from tests.harness import assert_close

    chunk = 3
    stateful = keras.Sequential([keras.Input((chunk, I), batch_size=B),
                                 keras.layers.LSTM(4, return_sequences=True, stateful=True)])
    randomized(stateful)
    whole = keras.Sequential([keras.Input((T, I)), keras.layers.LSTM(4, return_sequences=True)])
    whole.set_weights(stateful.get_weights())
    x = sequence_input()
    expected = np.asarray(whole(x))
    data, report = convert_keras(stateful)
    assert op_names(data) == ["UNIDIRECTIONAL_SEQUENCE_LSTM"]
    assert any("(stateful)" in line for line in report.fused)
    for interp in (litert(data), KilnInterpreter(model_content=data)):
        for round_ in range(2):
            for k in range(0, T, chunk):
                (got,) = invoke(interp, [x[:, k:k + chunk]], allocate=(round_, k) == (0, 0))
                assert_close(got, expected[:, k:k + chunk], atol=1e-5)
            interp.reset_all_variables()


@pytest.mark.parametrize("lib", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_static_batch_state_prologue_is_one_fill_per_state(lib):
    """With a static batch, the zero state needs no shape arithmetic at run time: each state
    variable is written by one FILL of constants (TF's SHAPE/STRIDED_SLICE/PACK/FILL prologue
    and kiln's copy into the variable fold away)."""
    L = lib.layers
    m = randomized(lib.Sequential([L.InputLayer((T, I), batch_size=B), L.LSTM(5, return_sequences=True),
                                   L.LSTM(4)]))
    x = np.random.default_rng(3).standard_normal((B, T, I)).astype(np.float32)
    data, _ = convert_keras(m)
    names = op_names(data)
    assert sorted(names) == sorted(["FILL"] * 4 + ["UNIDIRECTIONAL_SEQUENCE_LSTM"] * 2 + ["STRIDED_SLICE"]), names
    check_both(data, [x], [np.asarray(m(x))])
