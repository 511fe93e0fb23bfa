"""Keras LSTM composites -> UNIDIRECTIONAL_SEQUENCE_LSTM, checked against TensorFlow.

The composite calls are built by hand exactly as the importer builds them (frozen weights as
constants, the sequence as a model input); the fused model runs in LiteRT and in kiln and
must reproduce the Keras layer within 1e-5, on a first and a second invocation.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.fusion.registry import NotFusable
from tests.fusion.util import In, check_both, composite_model, op_names
from tests.harness import Const

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")
keras = pytest.importorskip("keras")

B, T, I, H = 3, 6, 5, 4


def _rng(seed=0):
    return np.random.default_rng(seed)


def _tf_keras_lstm(**kw):
    layer = tf_keras.layers.LSTM(H, return_state=True, **kw)
    layer.build((None, None, I))
    rng = _rng(1)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])
    return layer


@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("dynamic_batch", [False, True])
def test_tf_keras_api_implements(time_major, go_backwards, return_sequences, dynamic_batch):
    """tf_keras' own ``lstm_<uuid>`` function: 5 results, all reproduced (TensorFlow's
    converter returns zeros for the final states)."""
    layer = _tf_keras_lstm(time_major=time_major, go_backwards=go_backwards,
                           return_sequences=return_sequences)
    shape = (T, B, I) if time_major else (B, T, I)
    x = _rng(2).standard_normal(shape).astype(np.float32)
    out, h, c = [t.numpy() for t in layer(x)]
    k, r, b = layer.get_weights()
    zeros = np.zeros((B, H), np.float32)
    batch_axis = 1 if time_major else 0
    seq = out if return_sequences else np.expand_dims(h, 0 if time_major else 1)
    built = composite_model(
        "lstm_0b3c9a5e-uuid", {"time_major": time_major, "go_backwards": go_backwards},
        [In(x, dynamic=(batch_axis,) if dynamic_batch else ()), Const(zeros), Const(zeros),
         Const(k), Const(r), Const(b)], 5, keep=[0, 1, 3],
        out_shapes=[(B, H), seq.shape, (B, H), (B, H), ()])
    expected = [h, seq, c]
    names = op_names(built.model)
    assert names.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1 and "WHILE" not in names
    assert ("REVERSE_V2" in names) == go_backwards
    check_both(built.model, built.feeds, expected)


def test_tf_keras_initial_state_from_inputs():
    """Initial states fed at run time (an encoder's states into a decoder)."""
    layer = _tf_keras_lstm(return_sequences=True)
    rng = _rng(3)
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    h0, c0 = (rng.standard_normal((B, H)).astype(np.float32) for _ in range(2))
    out, h, c = [t.numpy() for t in layer(x, initial_state=[tf.constant(h0), tf.constant(c0)])]
    k, r, b = layer.get_weights()
    built = composite_model("lstm_x", {}, [In(x), In(h0), In(c0), Const(k), Const(r), Const(b)], 5,
                            keep=[1, 2, 3], out_shapes=[(B, H), (B, T, H), (B, H), (B, H), ()])
    check_both(built.model, built.feeds, [out, h, c], invokes=3)


def _keras3_lstm(**kw):
    layer = keras.layers.LSTM(H, return_sequences=True, return_state=True, **kw)
    layer.build((None, T, I))
    rng = _rng(4)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])
    return layer


def _kiln_lstm_args(layer, x, h0=None, c0=None):
    cell = layer.cell
    zeros = np.zeros((x.shape[0], H), np.float32)
    bias = cell.bias.numpy() if cell.use_bias else np.zeros(4 * H, np.float32)
    return [In(x), Const(zeros if h0 is None else h0), Const(zeros if c0 is None else c0),
            Const(cell.kernel.numpy()), Const(cell.recurrent_kernel.numpy()), Const(bias)]


@pytest.mark.parametrize("activation", ["tanh", "relu", "relu6"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_keras3_layer_composite(activation, use_bias):
    layer = _keras3_lstm(activation=activation, use_bias=use_bias)
    x = _rng(5).standard_normal((B, T, I)).astype(np.float32)
    out, h, c = [np.asarray(t) for t in layer(x)]
    attrs = {"layer": "lstm_7", "activation": activation, "recurrent_activation": "sigmoid",
             "return_sequences": True}
    built = composite_model("kiln_keras_lstm", attrs, _kiln_lstm_args(layer, x), 3)
    assert built.notes == ["lstm_7: fused into UNIDIRECTIONAL_SEQUENCE_LSTM"]
    check_both(built.model, built.feeds, [out, h, c])


def test_keras3_constant_nonzero_initial_state():
    layer = _keras3_lstm()
    rng = _rng(6)
    x = rng.standard_normal((B, T, I)).astype(np.float32)
    h0, c0 = (rng.standard_normal((B, H)).astype(np.float32) for _ in range(2))
    out, h, c = [np.asarray(t) for t in layer(x, initial_state=[h0, c0])]
    built = composite_model("kiln_keras_lstm", {"return_sequences": True},
                            _kiln_lstm_args(layer, x, h0, c0), 3)
    check_both(built.model, built.feeds, [out, h, c])


@pytest.mark.parametrize("attrs, reason", [
    ({"recurrent_activation": "hard_sigmoid"},
     "lstm_2: not fused: recurrent_activation='hard_sigmoid' is not expressible in "
     "UNIDIRECTIONAL_SEQUENCE_LSTM"),
    ({"activation": "linear"}, "lstm_2: not fused: activation='linear' is not expressible"),
    ({"activation": "sigmoid"}, "lstm_2: not fused: activation='sigmoid' is not expressible"),
])
def test_inexpressible_activations_are_reported(attrs, reason):
    layer = _keras3_lstm()
    x = np.zeros((B, T, I), np.float32)
    with pytest.raises(NotFusable, match=reason.replace("(", r"\(")):
        composite_model("kiln_keras_lstm", {"layer": "lstm_2", **attrs}, _kiln_lstm_args(layer, x), 3)


def test_masked_tf_keras_function_is_not_fused():
    layer = _tf_keras_lstm()
    x = np.zeros((B, T, I), np.float32)
    k, r, b = layer.get_weights()
    mask = np.ones((B, T), np.bool_)
    zeros = np.zeros((B, H), np.float32)
    with pytest.raises(NotFusable, match="lstm_9: not fused: .*mask"):
        composite_model("lstm_abc", {}, [In(x), Const(zeros), Const(zeros), Const(k), Const(r),
                                         Const(b), In(mask)], 5, label="lstm_9")


def test_rejected_fusion_leaves_the_subgraph_untouched():
    """A fusion that fails half-way (stateful with a dynamic batch) takes its ops back."""
    from kiln.fusion.registry import CompositeCall, fuse_call
    from kiln.ir import Model
    from kiln.schema import DType

    layer = _keras3_lstm()
    sg = Model().add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, T, I), shape_signature=(-1, T, I))
    args = [x] + [sg.add_constant(f"w{k}", a.value) for k, a in enumerate(_kiln_lstm_args(layer, np.zeros((1, T, I), np.float32))[1:])]
    before = (list(sg.operators), list(sg.tensors))
    call = CompositeCall("kiln_keras_lstm", {"stateful": True, "layer": "lstm_s"}, args,
                         [np.float32] * 3, [()] * 3, sg)
    with pytest.raises(NotFusable, match="lstm_s: not fused: a stateful LSTM needs a fixed batch"):
        fuse_call(call)
    assert (sg.operators, sg.tensors) == before
    assert all(not t.users for t in args)


def test_weights_fold_into_per_gate_constants_only():
    """The transposed kernel is never stored: only the 4+4 gate blocks and 4 biases are."""
    layer = _keras3_lstm()
    x = np.zeros((B, T, I), np.float32)
    built = composite_model("kiln_keras_lstm", {"return_sequences": True},
                            _kiln_lstm_args(layer, x), 3, keep=[0])
    from kiln.format import read_model

    model = read_model(built.model)
    consts = [t for t in model.main.tensors if t.is_constant and t.data.size > 1]
    weight_bytes = sum(t.data.nbytes for t in consts)
    assert weight_bytes <= (4 * H * I + 4 * H * H + 4 * H + 3 * 8) * 4 + H * 4 * 2
