"""Keras 3 SavedModels exported without kiln's hook: the generic rnn() while loop is recognised
(kiln/converter/keras/lstm_loop.py) and becomes UNIDIRECTIONAL_ / BIDIRECTIONAL_SEQUENCE_LSTM, equal
to TensorFlow in LiteRT and in kiln; loops that are not a fusable LSTM stay correct WHILE
loops with the reason in the conversion report."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fusion.util import B, I, T, check_both, invoke, litert, op_names, randomized, sequence_input

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

UNI, BIDI = "UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM"


def _convert_saved(model, path, how="export"):
    """Export plainly (no prepare_keras_model) and convert with from_saved_model."""
    import kiln

    if how == "export":
        model.export(str(path), format="tf_saved_model", verbose=False)
    else:
        tf.saved_model.save(model, str(path))
    converter = kiln.TFLiteConverter.from_saved_model(str(path))
    return converter.convert(), converter.report


def _expected(model, feeds):
    out = model(feeds if len(feeds) > 1 else feeds[0])
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def _seq(**kw):
    inp = keras.Input((T, I))
    return keras.Model(inp, keras.layers.LSTM(4, **kw)(inp))


def _stacked():
    inp = keras.Input((T, I))
    y = keras.layers.LSTM(5, return_sequences=True)(inp)
    y = keras.layers.LSTM(4, return_sequences=True, go_backwards=True)(y)
    return keras.Model(inp, keras.layers.LSTM(3)(y))


def _embedding():
    inp = keras.Input((T,), dtype="int32")
    y = keras.layers.Embedding(10, I)(inp)
    return keras.Model(inp, keras.layers.LSTM(4, return_sequences=True)(y))


UNI_MODELS = {
    "return_sequences": (lambda: _seq(return_sequences=True), 1),
    "last_output": (lambda: _seq(), 1),
    "go_backwards": (lambda: _seq(go_backwards=True, return_sequences=True), 1),
    "relu_no_bias_implementation_1": (
        lambda: _seq(activation="relu", use_bias=False, implementation=1, return_sequences=True), 1),
    "relu6_return_state": (lambda: _seq(activation="relu6", return_state=True), 1),
    "stacked": (_stacked, 3),
    "embedding": (_embedding, 1),
}


@pytest.mark.parametrize("name", sorted(UNI_MODELS))
def test_keras3_lstm_loop_is_fused(tmp_path, name):
    build, n_lstm = UNI_MODELS[name]
    model = randomized(build())
    data, report = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert names.count(UNI) == n_lstm and "WHILE" not in names, names
    assert sum(f"fused into {UNI} (Keras LSTM loop" in line for line in report.fused) == n_lstm
    assert not report.not_fused
    if name == "embedding":
        feeds = [np.random.default_rng(2).integers(0, 10, (B, T)).astype(np.int32)]
    else:
        feeds = [sequence_input()]
    check_both(data, feeds, _expected(model, feeds))


def test_tf_saved_model_save_and_dynamic_time(tmp_path):
    """tf.saved_model.save of a model with unknown batch and time: the loop's bound is
    shape(x)[1]; every sequence length runs."""
    inp = keras.Input((None, I))
    model = randomized(keras.Model(inp, keras.layers.LSTM(4, return_sequences=True)(inp)))
    data, _ = _convert_saved(model, tmp_path, how="save")
    names = op_names(data)
    assert names.count(UNI) == 1 and "WHILE" not in names
    for shape in ((B, 7, I), (3, 2, I)):
        x = sequence_input(shape)
        check_both(data, [x], _expected(model, [x]))


def test_explicit_initial_state(tmp_path):
    inp, h0, c0 = keras.Input((T, I)), keras.Input((4,)), keras.Input((4,))
    out = keras.layers.LSTM(4, return_sequences=True, return_state=True)(inp, initial_state=[h0, c0])
    model = randomized(keras.Model([inp, h0, c0], list(out)))
    data, _ = _convert_saved(model, tmp_path)
    assert op_names(data).count(UNI) == 1
    feeds = [sequence_input(), sequence_input((B, 4), 2), sequence_input((B, 4), 3)]
    check_both(data, feeds, _expected(model, feeds))


@pytest.mark.parametrize("merge_mode, return_sequences, return_state", [
    ("concat", True, False),
    ("sum", False, True),
    (None, False, False),
])
def test_bidirectional_is_one_op(tmp_path, merge_mode, return_sequences, return_state):
    inp = keras.Input((T, I))
    out = keras.layers.Bidirectional(
        keras.layers.LSTM(4, return_sequences=return_sequences, return_state=return_state),
        merge_mode=merge_mode)(inp)
    model = randomized(keras.Model(inp, list(out) if isinstance(out, (list, tuple)) else out))
    data, report = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert names.count(BIDI) == 1 and UNI not in names and "WHILE" not in names, names
    assert any(f"fused into one {BIDI}" in line for line in report.fused), report.fused
    assert not any(f"fused into {UNI}" in line for line in report.fused)
    x = sequence_input()
    check_both(data, [x], _expected(model, [x]))


def test_stacked_bidirectional_with_initial_state(tmp_path):
    inp = keras.Input((None, I))
    states = [keras.Input((3,)) for _ in range(4)]
    y = keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))(
        inp, initial_state=states)
    y = keras.layers.Bidirectional(keras.layers.LSTM(2))(y)
    model = randomized(keras.Model([inp, *states], y))
    data, _ = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert names.count(BIDI) == 2 and "WHILE" not in names, names
    feeds = [sequence_input((B, 5, I))] + [sequence_input((B, 3), seed) for seed in range(4)]
    check_both(data, feeds, _expected(model, feeds))


def test_backward_loop_first_still_merges(tmp_path):
    """Two LSTM layers over one input, the go_backwards one traced first: one op, whose
    backward output the earlier loop's readers now take (reversed to processing order)."""
    inp = keras.Input((T, I))
    y_bw = keras.layers.LSTM(4, go_backwards=True, return_sequences=True)(inp)
    y_fw = keras.layers.LSTM(4, return_sequences=True)(inp)
    model = randomized(keras.Model(inp, keras.layers.Concatenate()([y_bw, y_fw])))
    data, _ = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert names.count(BIDI) == 1 and UNI not in names, names
    x = sequence_input()
    check_both(data, [x], _expected(model, [x]))


def test_directions_of_different_sizes_stay_two_ops(tmp_path):
    inp = keras.Input((T, I))
    layer = keras.layers.Bidirectional(
        keras.layers.LSTM(4, return_sequences=True),
        backward_layer=keras.layers.LSTM(3, return_sequences=True, go_backwards=True))
    model = randomized(keras.Model(inp, layer(inp)))
    data, _ = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert names.count(UNI) == 2 and BIDI not in names and "WHILE" not in names, names
    x = sequence_input()
    check_both(data, [x], _expected(model, [x]))


# -- hand-written loops: matched by structure, not by names -------------------------------------

def _handmade(peephole=False, time_major=False):
    """A TF1-style LSTM in a tf.while_loop: one kernel over [x, h], gates stacked i, g, f, o,
    a forget bias of 1 (or a peephole term reading c); the input batch- or time-major."""
    rng = np.random.default_rng(5)
    u = 4
    kernel = tf.Variable(rng.uniform(-0.5, 0.5, (I + u, 4 * u)).astype(np.float32))
    bias = tf.Variable(rng.uniform(-0.5, 0.5, 4 * u).astype(np.float32))
    peep = tf.Variable(rng.uniform(-0.5, 0.5, u).astype(np.float32))

    spec = [T, None, I] if time_major else [None, T, I]

    @tf.function(input_signature=[tf.TensorSpec(spec, tf.float32)])
    def model(x):
        seq = x if time_major else tf.transpose(x, [1, 0, 2])
        inputs = tf.TensorArray(tf.float32, size=T).unstack(seq)
        outputs = tf.TensorArray(tf.float32, size=T, element_shape=[None, u])
        zeros = tf.zeros([tf.shape(seq)[1], u])

        def body(t, ta, h, c):
            z = tf.matmul(tf.concat([inputs.read(t), h], 1), kernel) + bias
            i, g, f, o = tf.split(z, 4, axis=1)
            f = f + (c * peep if peephole else 1.0)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
            return t + 1, ta.write(t, h), h, c

        _, ta, _, c = tf.while_loop(lambda t, *_: t < T, body, (0, outputs, zeros, zeros))
        return (ta.stack() if time_major else tf.transpose(ta.stack(), [1, 0, 2])), c

    return model


def _convert_function(fn):
    import kiln

    converter = kiln.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
    return converter.convert(), converter.report


@pytest.mark.parametrize("time_major", [False, True])
def test_handmade_loop_with_other_gate_order_is_fused(time_major):
    model = _handmade(time_major=time_major)
    data, report = _convert_function(model)
    names = op_names(data)
    assert names.count(UNI) == 1 and "WHILE" not in names, names
    x = sequence_input((T, B, I) if time_major else (B, T, I))
    check_both(data, [x], [o.numpy() for o in model(x)])


def test_stateful_layer_keeps_its_state_in_variables(tmp_path):
    """A stateful layer's state lives in resource variables read before and assigned after
    the loop: fused, consecutive invocations continue the sequence as in Keras. Exported with
    a dynamic batch the state's fixed batch cannot fit the fused op: a loop, with the reason."""
    import kiln
    from kiln.runtime import Interpreter as KilnInterpreter

    inp = keras.Input((T, I), batch_size=B)
    model = randomized(keras.Model(inp, keras.layers.LSTM(4, stateful=True, return_sequences=True)(inp)))
    model.export(str(tmp_path / "fixed"), format="tf_saved_model", verbose=False,
                 input_signature=[tf.TensorSpec([B, T, I], tf.float32)])
    data, report = _convert_saved(model, tmp_path / "dynamic")
    assert "WHILE" in op_names(data)
    assert any("fixed batch of 2" in line for line in report.not_fused), report.not_fused
    converter = kiln.TFLiteConverter.from_saved_model(str(tmp_path / "fixed"))
    data = converter.convert()
    assert op_names(data).count(UNI) == 1
    x = sequence_input()
    expected = [np.asarray(model(x)), np.asarray(model(x))]
    for interp in (litert(data), KilnInterpreter(model_content=data)):
        got = [invoke(interp, [x])[0], invoke(interp, [x], allocate=False)[0]]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


# -- near misses: correct loops, with the reason ----------------------------------------------

def _near(kind):
    inp = keras.Input((T, I))
    if kind == "gru":
        return keras.Model(inp, keras.layers.GRU(4)(inp)), "a GRU or SimpleRNN carries one"
    if kind == "hard_sigmoid":
        return (keras.Model(inp, keras.layers.LSTM(4, recurrent_activation="hard_sigmoid")(inp)),
                "not Sigmoid")
    if kind == "linear":
        return keras.Model(inp, keras.layers.LSTM(4, activation="linear")(inp)), "activation='linear'"
    ids = keras.Input((T,), dtype="int32")
    y = keras.layers.Embedding(10, I, mask_zero=True)(ids)
    return keras.Model(ids, keras.layers.LSTM(4)(y)), "a mask reaches the layer"


@pytest.mark.parametrize("kind", ["gru", "hard_sigmoid", "linear", "mask"])
def test_near_misses_stay_loops_with_the_reason(tmp_path, kind):
    model, reason = _near(kind)
    model = randomized(model)
    data, report = _convert_saved(model, tmp_path)
    names = op_names(data)
    assert "WHILE" in names and UNI not in names
    assert any(": not fused: " in line and reason in line for line in report.not_fused), \
        report.not_fused
    if kind == "mask":
        ids = np.random.default_rng(2).integers(1, 10, (B, T)).astype(np.int32)
        ids[0, 4:] = 0
        feeds = [ids]
    else:
        feeds = [sequence_input()]
    check_both(data, feeds, _expected(model, feeds))


def test_peephole_loop_stays_a_loop():
    model = _handmade(peephole=True)
    data, report = _convert_function(model)
    assert "WHILE" in op_names(data)
    assert any("peephole" in line for line in report.not_fused), report.not_fused
    x = sequence_input()
    check_both(data, [x], [o.numpy() for o in model(x)])


def test_other_loops():
    """A loop over a sequence that is no LSTM gets a reason; a loop over no sequence is not an
    RNN and nothing is said about it."""
    @tf.function(input_signature=[tf.TensorSpec([B, T, I], tf.float32)])
    def cumsum(x):
        inputs = tf.TensorArray(tf.float32, size=T).unstack(tf.transpose(x, [1, 0, 2]))
        outputs = tf.TensorArray(tf.float32, size=T)

        def body(t, ta, s):
            s = s + inputs.read(t)
            return t + 1, ta.write(t, s), s

        _, ta, _ = tf.while_loop(lambda t, *_: t < T, body, (0, outputs, tf.zeros([B, I])))
        return ta.stack()

    @tf.function(input_signature=[tf.TensorSpec([B, I], tf.float32)])
    def power(x):
        return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * x), (0, x))[1]

    for fn, reasons in ((cumsum, 1), (power, 0)):
        data, report = _convert_function(fn)
        assert "WHILE" in op_names(data)
        assert len(report.not_fused) == reasons, report.not_fused
        x = sequence_input(fn.input_signature[0].shape)
        check_both(data, [x], [fn(x).numpy()])
