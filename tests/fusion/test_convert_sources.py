"""End to end through kiln's converter from concrete functions and SavedModels: tf_keras'
``lstm_`` functions, Keras 3 exports made inside prepare_keras_model, lingvo cells,
embedding_lookup and tfl_fusable_op composites."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fusion.test_lingvo import cell_reference
from tests.fusion.util import B, I, T, check_both, op_names, randomized, sequence_input

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
tf_keras = pytest.importorskip("tf_keras")



def _convert(converter):
    data = converter.convert()
    return data, converter.report


def test_tf_keras_concrete_function_uses_its_lstm_function():
    """No hook: tf_keras' own api_implements function is fused (batch size fixed or not)."""
    import kiln

    model = randomized(tf_keras.Sequential([tf_keras.Input((T, I)),
                                            tf_keras.layers.LSTM(4, return_sequences=True),
                                            tf_keras.layers.LSTM(3, go_backwards=True)]))
    fn = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec([None, T, I]))
    data, report = _convert(kiln.TFLiteConverter.from_concrete_functions([fn]))
    names = op_names(data)
    assert names.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 2 and "WHILE" not in names
    assert sum("fused into UNIDIRECTIONAL_SEQUENCE_LSTM" in line for line in report.fused) == 2
    x = sequence_input()
    check_both(data, [x], [model(x).numpy()])


def test_tf_keras_gru_function_is_declined_with_the_reason():
    import kiln

    model = randomized(tf_keras.Sequential([tf_keras.Input((T, I), batch_size=B),
                                            tf_keras.layers.GRU(4, return_sequences=True)]))
    fn = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec([B, T, I]))
    data, report = _convert(kiln.TFLiteConverter.from_concrete_functions([fn]))
    assert any("not fused: LiteRT has no fused GRU op" in line for line in report.not_fused)
    x = sequence_input()
    check_both(data, [x], [model(x).numpy()])


def test_tf_keras_saved_model(tmp_path):
    import kiln

    model = randomized(tf_keras.Sequential([tf_keras.Input((T, I)),
                                            tf_keras.layers.LSTM(4, return_sequences=True)]))
    tf.saved_model.save(model, str(tmp_path))
    data, _ = _convert(kiln.TFLiteConverter.from_saved_model(str(tmp_path)))
    assert op_names(data).count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1
    x = sequence_input()
    check_both(data, [x], [model(x).numpy()])


def test_keras3_export_inside_the_hook_fuses_from_saved_model(tmp_path):
    import kiln
    from kiln.converter import prepare_keras_model

    inp = keras.Input((T, I))
    y = keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))(inp)
    model = randomized(keras.Model(inp, keras.layers.LSTM(2)(y)))
    with prepare_keras_model(model):
        model.export(str(tmp_path), format="tf_saved_model", verbose=False)
    data, _ = _convert(kiln.TFLiteConverter.from_saved_model(str(tmp_path)))
    names = op_names(data)
    assert names.count("BIDIRECTIONAL_SEQUENCE_LSTM") == 1 and "WHILE" not in names
    x = sequence_input()
    check_both(data, [x], [np.asarray(model(x))])


@pytest.mark.parametrize("interface, projection, layer_norm", [
    ("LSTMCellSimple", True, False),
    ("LayerNormalizedLstmCellSimple", False, True),
    ("LayerNormalizedLstmCellSimple", True, True),
])
def test_lingvo_cells_in_a_tf_function(interface, projection, layer_norm):
    """A tf.function implementing the interface inside a model; weights are variables."""
    import kiln

    rng = np.random.default_rng(3)
    n_cell, n_proj = 4, 3
    n_out = n_proj if projection else n_cell
    weight = tf.Variable(rng.uniform(-0.7, 0.7, (I + n_out, 4 * n_cell)).astype(np.float32))
    bias = tf.Variable(rng.uniform(-0.5, 0.5, 4 * n_cell).astype(np.float32))
    proj = tf.Variable(rng.uniform(-0.7, 0.7, (n_cell, n_proj)).astype(np.float32)) if projection \
        else tf.constant(np.zeros(0, np.float32))
    extra = [tf.Variable(rng.uniform(0.5, 1.5, 4 * n_cell).astype(np.float32))] if layer_norm else []

    def body(x, w, b, p, *ln):
        return cell_reference(x, w, b, p if projection else None, *(ln or (None,)))

    cell = tf.function(body, experimental_implements=interface)

    @tf.function(input_signature=[tf.TensorSpec([B, T, I], tf.float32)])
    def model(x):
        return tf.nn.relu(cell(x, weight, bias, proj, *extra))

    data, report = _convert(kiln.TFLiteConverter.from_concrete_functions(
        [model.get_concrete_function()]))
    names = op_names(data)
    assert names.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1 and "WHILE" not in names
    x = sequence_input()
    # The reference is the contract run eagerly: in graph mode, TF's oneDNN remapper (on by
    # default on x86) rewrites the moments/normalise pattern into its own layer norm with a
    # different epsilon, and the traced function then differs by ~0.2 from the eager one.
    expected = tf.nn.relu(body(tf.constant(x), weight, bias, proj, *extra)).numpy()
    check_both(data, [x], [expected])


def test_embedding_lookup_and_custom_op_composites():
    import kiln

    table = tf.constant(np.random.default_rng(4).standard_normal((10, 3)).astype(np.float32))
    lookup = tf.function(lambda params, ids: tf.gather(params, ids),
                         experimental_implements="embedding_lookup")
    scale = tf.function(lambda x: x * 3.0, experimental_implements=kiln.fusion.implements(
        "acme.scale", tfl_fusable_op=True, factor=3.0))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.int32)])
    def model(ids):
        return scale(lookup(table, ids))

    converter = kiln.TFLiteConverter.from_concrete_functions([model.get_concrete_function()])
    data = converter.convert()
    read = kiln.read_model(data)
    ops = [op for _, _, op in read.operators()]
    assert [op.name for op in ops] == ["GATHER", "acme.scale"]
    from flatbuffers import flexbuffers

    assert flexbuffers.Loads(ops[1].custom_options) == {"factor": 3.0}
