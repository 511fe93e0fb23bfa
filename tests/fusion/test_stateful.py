"""Stateful LSTMs (TensorFlow's converter: unsupported): the state lives in the fused op's
variable tensors, consecutive invocations continue the sequence, reset_all_variables()
starts over."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime import Interpreter as KilnInterpreter
from tests.fusion.util import In, composite_model, invoke, litert, op_names
from tests.harness import Const, assert_close

keras = pytest.importorskip("keras")

B, T, I, H, CHUNK = 2, 12, 3, 5, 4


def _weights(layer, seed):
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                       for w in layer.get_weights()])
    return layer


def _stateful_bidirectional():
    fw = keras.layers.LSTM(H, return_sequences=True, stateful=True)
    bw = keras.layers.LSTM(H, return_sequences=True, stateful=True, go_backwards=True)
    layer = keras.layers.Bidirectional(fw, backward_layer=bw)
    model = keras.Sequential([keras.Input((CHUNK, I), batch_size=B), layer])
    return model, layer


def _cell_args(cell):
    return [Const(np.asarray(cell.kernel)), Const(np.asarray(cell.recurrent_kernel)),
            Const(np.asarray(cell.bias))]


def test_chunks_continue_the_sequence_like_tensorflow_on_the_whole_sequence():
    whole = keras.layers.LSTM(H, return_sequences=True)
    whole.build((B, T, I))
    _weights(whole, 3)
    x = np.random.default_rng(4).standard_normal((B, T, I)).astype(np.float32)
    expected = np.asarray(whole(x))
    zeros = np.zeros((B, H), np.float32)
    built = composite_model(
        "kiln_keras_lstm", {"layer": "lstm", "stateful": True, "return_sequences": True},
        [In(x[:, :CHUNK]), Const(zeros), Const(zeros), *_cell_args(whole.cell)], 3, keep=[0],
        label="lstm")
    assert built.notes == ["lstm: fused into UNIDIRECTIONAL_SEQUENCE_LSTM (stateful)"]
    assert op_names(built.model) == ["UNIDIRECTIONAL_SEQUENCE_LSTM"]  # no state initialisation
    for name, interp in (("litert", litert(built.model)),
                         ("kiln", KilnInterpreter(model_content=built.model))):
        for round_ in range(2):  # the second round after reset_all_variables()
            for k in range(0, T, CHUNK):
                (got,) = invoke(interp, [x[:, k:k + CHUNK]], allocate=(round_, k) == (0, 0))
                assert_close(got, expected[:, k:k + CHUNK], atol=1e-5,
                             what=f"{name} round {round_} chunk {k // CHUNK}")
            interp.reset_all_variables()


def test_stateful_bidirectional_matches_keras_chunk_by_chunk():
    model, layer = _stateful_bidirectional()
    _weights(layer, 5)
    x = np.random.default_rng(6).standard_normal((B, T, I)).astype(np.float32)
    expected = [np.asarray(model(x[:, k:k + CHUNK])) for k in range(0, T, CHUNK)]
    zeros = np.zeros((B, H), np.float32)
    args = [In(x[:, :CHUNK])]
    for sub in (layer.forward_layer, layer.backward_layer):
        args += [Const(zeros), Const(zeros), *_cell_args(sub.cell)]
    attrs = {"layer": "bidi", "stateful": True, "return_sequences": True, "merge_mode": "concat"}
    built = composite_model("kiln_keras_bidirectional_lstm", attrs, args, 5, keep=[0])
    for interp in (litert(built.model), KilnInterpreter(model_content=built.model)):
        for k, want in enumerate(expected):
            (got,) = invoke(interp, [x[:, k * CHUNK:(k + 1) * CHUNK]], allocate=k == 0)
            assert_close(got, want, atol=1e-5, what=f"chunk {k}")
