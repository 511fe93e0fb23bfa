"""lingvo-style cells (LSTMCellSimple, LayerNormalizedLstmCellSimple) by interface contract.

The reference is a TensorFlow function implementing the contract of TensorFlow's converter
(lstm_utils.cc): weight [n_input + n_output, G * n_cell] with gates c, i, f, o on the
columns, bias likewise, projection [n_cell, n_output], layer-norm scales per gate.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.fusion.registry import NotFusable
from kiln.runtime import Interpreter as KilnInterpreter
from tests.fusion.util import In, check_both, composite_model, invoke, litert, op_names
from tests.harness import Const, assert_close

tf = pytest.importorskip("tensorflow")

B, T, N_IN, N_CELL, N_PROJ = 2, 5, 3, 4, 3


def cell_reference(x, weight, bias, projection=None, ln=None, *, cifg=False, cell_clip=10.0):
    """TensorFlow ops for the contract, over [batch, time, n_input] from a zero state."""
    layout = "cfo" if cifg else "cifo"
    n_cell = weight.shape[1] // len(layout)
    n_out = n_cell if projection is None else projection.shape[1]
    ln_layout = "cifo" if ln is not None and ln.shape[0] == 4 * n_cell else layout
    m = tf.zeros([x.shape[0], n_out])
    c = tf.zeros([x.shape[0], n_cell])
    outs = []
    for t in range(x.shape[1]):
        z = tf.matmul(tf.concat([x[:, t], m], 1), weight)
        pre = dict(zip(layout, tf.split(z, len(layout), 1)))
        b = dict(zip(layout, tf.split(bias, len(layout))))
        for g in layout:
            if ln is not None:
                mean, var = tf.nn.moments(pre[g], [1], keepdims=True)
                scale = ln[ln_layout.index(g) * n_cell:(ln_layout.index(g) + 1) * n_cell]
                pre[g] = (pre[g] - mean) / tf.sqrt(var + 1e-8) * scale
            pre[g] = pre[g] + b[g]
        f = tf.sigmoid(pre["f"])
        i = 1.0 - f if cifg else tf.sigmoid(pre["i"])
        c = tf.clip_by_value(f * c + i * tf.tanh(pre["c"]), -cell_clip, cell_clip)
        m = tf.sigmoid(pre["o"]) * tf.tanh(c)
        if projection is not None:
            m = tf.matmul(m, projection)
        outs.append(m)
    return tf.stack(outs, 1)


def _case(seed, *, projection, layer_norm, cifg, ln_size=4):
    rng = np.random.default_rng(seed)
    n_gates = 3 if cifg else 4
    n_out = N_PROJ if projection else N_CELL
    w = rng.uniform(-0.7, 0.7, (N_IN + n_out, n_gates * N_CELL)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, n_gates * N_CELL).astype(np.float32)
    p = rng.uniform(-0.7, 0.7, (N_CELL, N_PROJ)).astype(np.float32) if projection else None
    ln = rng.uniform(0.5, 1.5, ln_size * N_CELL).astype(np.float32) if layer_norm else None
    x = rng.standard_normal((B, T, N_IN)).astype(np.float32)
    return x, w, b, p, ln


def _name(layer_norm, cifg, extra=""):
    base = "LayerNormalizedLstmCellSimple" if layer_norm else "LSTMCellSimple"
    return base + (",couple_input_forget_gates" if cifg else "") + extra


def _args(x, w, b, p, ln, step=False):
    no_projection = np.zeros((0,), np.float32)  # "not 2-D": no projection
    args = [In(x), Const(w), Const(b), Const(p if p is not None else no_projection)]
    return args + ([Const(ln)] if ln is not None else [])


CASES = [
    dict(projection=False, layer_norm=False, cifg=False),
    dict(projection=True, layer_norm=False, cifg=False),
    dict(projection=False, layer_norm=True, cifg=False),
    dict(projection=True, layer_norm=True, cifg=False),
    dict(projection=False, layer_norm=False, cifg=True),
    dict(projection=True, layer_norm=True, cifg=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(k for k, v in c.items() if v) or "plain")
def test_sequence_matches_tensorflow(case):
    x, w, b, p, ln = _case(11, **case)
    implements = _name(case["layer_norm"], case["cifg"])
    expected = cell_reference(x, w, b, p, ln, cifg=case["cifg"]).numpy()
    built = composite_model(implements, {}, _args(x, w, b, p, ln), 1, label="rnn/cell")
    names = op_names(built.model)
    assert names.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1 and "WHILE" not in names
    assert built.notes[0].startswith("rnn/cell: ")
    check_both(built.model, built.feeds, [expected])


def test_cell_clip_from_the_implements_string():
    x, w, b, p, ln = _case(12, projection=False, layer_norm=False, cifg=False)
    w = w * 4  # large pre-activations: the cell state exceeds the clip
    expected = cell_reference(x * 3, w, b, cell_clip=0.5).numpy()
    built = composite_model("LSTMCellSimple,cell_clip=0.5", {}, _args(x * 3, w, b, p, ln), 1)
    check_both(built.model, built.feeds, [expected])


def test_cifg_with_three_layer_norm_scales():
    x, w, b, p, ln = _case(13, projection=False, layer_norm=True, cifg=True, ln_size=3)
    expected = cell_reference(x, w, b, None, ln, cifg=True).numpy()
    built = composite_model(_name(True, True), {}, _args(x, w, b, p, ln), 1)
    check_both(built.model, built.feeds, [expected])


def test_single_step_input_streams_state_across_invocations():
    """[batch, n_input] input: one step per invoke, the state carried in the op's variables
    (TensorFlow's converter contract); reset_all_variables() starts the stream over."""
    x, w, b, p, ln = _case(14, projection=True, layer_norm=True, cifg=False)
    expected = cell_reference(x, w, b, p, ln).numpy()
    built = composite_model(_name(True, False), {}, _args(x[:, 0], w, b, p, ln), 1)
    for interp in (litert(built.model), KilnInterpreter(model_content=built.model)):
        for round_ in range(2):
            for t in range(T):
                (got,) = invoke(interp, [x[:, t]], allocate=(round_, t) == (0, 0))
                assert_close(got, expected[:, t], atol=1e-5, what=f"step {t}")
            interp.reset_all_variables()


def test_single_step_without_streaming():
    x, w, b, p, ln = _case(15, projection=False, layer_norm=False, cifg=False)
    expected = cell_reference(x[:, :1], w, b).numpy()[:, 0]
    built = composite_model("LSTMCellSimple", {"stateful": False}, _args(x[:, 0], w, b, p, ln), 1)
    check_both(built.model, built.feeds, [expected], invokes=3)


def test_wrong_interface_is_reported():
    x, w, b, p, ln = _case(16, projection=False, layer_norm=False, cifg=False)
    with pytest.raises(NotFusable, match="cell: not fused: LSTMCellSimple takes 4 arguments"):
        composite_model("LSTMCellSimple", {}, [In(x), Const(w), Const(b)], 1, label="cell")
    with pytest.raises(NotFusable, match="cell: not fused: the input must be"):
        composite_model("LSTMCellSimple", {}, _args(x[:, :, :2], w, b, p, ln), 1, label="cell")
