"""The hybrid (dynamic-range) UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_LSTM through XlaDelegate
(kiln/xla/lower_quant_lstm.py, one lax.scan per direction over kiln.kernels.hybrid_lstm's step):
claimed, and bit for bit with kiln's NumPy kernel — outputs and the variable states, invoke
after invoke — on one-op models with every cell feature LiteRT has (CIFG, peephole, layer norm,
projection, clipping, activations and NONE's quirk, aux inputs, both layouts, symmetric and
asymmetric input quantization), and on Keras LSTM / Bidirectional(LSTM) models quantized
dynamic-range by kiln, where LiteRT's BUILTIN_REF gives the same bits too."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

#: `make test` runs each function's first case and one in 2; the slow lane the rest (conftest.py).
FAST_LANE_SHARE = 2

import kiln  # noqa: E402
from kiln.schema import Activation  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.harness import Const, Var, _kernel_outputs, single_op_model  # noqa: E402
from tests.ops import test_lstm as lstm_cases  # noqa: E402
from tests.quant.test_hybrid_lstm import BIDI_MATRICES, ODD_CASES, UNI_MATRICES, _hybrid, _run, odd_case  # noqa: E402

UNI = "UNIDIRECTIONAL_SEQUENCE_LSTM"
BIDI = "BIDIRECTIONAL_SEQUENCE_LSTM"
#: kiln's kernels alone (the default delegates would run LiteRT's kernels first).
REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}


def _model(op_type, operands, options, positions):
    probe = _kernel_outputs(op_type, operands, options, None)   # shapes from the float kernel
    operands = _hybrid(operands, positions)
    model = single_op_model(op_type, operands, options=options, out_dtypes=[p.dtype for p in probe],
                            out_shapes=[p.shape for p in probe])
    return model, [np.asarray(x) for x in operands if x is not None and not isinstance(x, (Const, Var))]


def same_as_kernel(op_type, operands, options, states, positions):
    """The hybrid one-op model through XlaDelegate and on kiln's NumPy kernel: equal bits, the
    node claimed."""
    model, feeds = _model(op_type, operands, options, positions)
    delegate = XlaDelegate()
    ours = _run(model, feeds, states,
                lambda m: kiln.Interpreter(model_content=m, experimental_delegates=[delegate], **REF))
    want = _run(model, feeds, states, lambda m: kiln.Interpreter(model_content=m, **REF))
    assert [op for _, op, _ in delegate.claimed] == [op_type], delegate.rejected
    for run, (got, exp) in enumerate(zip(ours, want)):
        for k, (g, w) in enumerate(zip(got, exp)):
            assert g.dtype == w.dtype == np.float32 and g.shape == w.shape
            np.testing.assert_array_equal(g, w, err_msg=f"{op_type} run {run} output {k}")


UNI_FEATURES = {name: f for name, f in lstm_cases.UNI_FEATURES.items() if "diagonal" not in name}


@pytest.mark.parametrize("time_major, asymmetric", [(False, True), (True, False)])
@pytest.mark.parametrize("features", UNI_FEATURES.values(), ids=UNI_FEATURES.keys())
def test_uni_lstm_features(features, time_major, asymmetric):
    rng = np.random.default_rng(1)
    operands, states = lstm_cases._uni_lstm(rng, time_major=time_major, n_input=20, n_cell=16, time=5, **features)
    options = {"fused_activation_function": Activation.TANH, "time_major": time_major,
               "asymmetric_quantize_inputs": asymmetric, "cell_clip": 0.8, "proj_clip": 0.5}
    same_as_kernel(UNI, operands, options, states, UNI_MATRICES)


@pytest.mark.parametrize("case", ODD_CASES)
def test_uni_lstm_odd_sizes_and_activations(case):
    operands, states, options = odd_case(*case)
    same_as_kernel(UNI, operands, options, states, UNI_MATRICES)


@pytest.mark.parametrize("merge, time_major", [(False, True), (True, False)])
@pytest.mark.parametrize("case", lstm_cases.BIDI_CASES.values(), ids=lstm_cases.BIDI_CASES.keys())
def test_bidi_lstm(case, time_major, merge):
    rng = np.random.default_rng(12)
    n_input = 3 if case.get("aux") and not case.get("aux_weights") else 9
    operands, states = lstm_cases._bidi_lstm(rng, time_major=time_major, n_input=n_input, n_cell=6, batch=2,
                                             time=4, **case)
    options = {"fused_activation_function": Activation.TANH, "time_major": time_major, "merge_outputs": merge,
               "asymmetric_quantize_inputs": True}
    same_as_kernel(BIDI, operands, options, states, BIDI_MATRICES)


def test_diagonal_recurrent_weights_are_left_to_the_kernel():
    """No hybrid kernel anywhere for diagonal recurrent weights: XLA says so and leaves the node."""
    rng = np.random.default_rng(3)
    operands, _ = lstm_cases._uni_lstm(rng, n_input=4, n_cell=4, time=2, diagonal=True)
    model, _ = _model(UNI, operands, {"diagonal_recurrent_tensors": True, "fused_activation_function": 4,
                                      "time_major": True}, UNI_MATRICES)
    delegate = XlaDelegate()
    kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF).allocate_tensors()
    assert not delegate.claimed
    assert any("diagonal recurrent weights have no hybrid kernel" in why for why in delegate.rejected.values())


# -- the models kiln writes ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["k3_lstm", "k3_bilstm"])
def test_dynamic_range_keras_models(name):
    """Keras 3 LSTM and Bidirectional(LSTM), quantized dynamic-range by kiln (hybrid v3 LSTMs):
    the XLA delegate claims every LSTM, and the LSTMs' outputs equal kiln's NumPy kernel's and
    LiteRT BUILTIN_REF's bit for bit, invoke after invoke. The delegate takes the
    LSTMs only, so that their outputs are partition outputs (readable)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    from tests.quant.test_hybrid_lstm import _converted

    model = kiln.quantize(_converted(name), "dynamic")
    ir = kiln.read_model(model)
    lstms = [op for op in ir.main.operators if op.op_type.endswith("SEQUENCE_LSTM")]
    assert lstms and all(op.inputs[2].dtype.name == "INT8" and op.version == 3 for op in lstms)
    watched = [op.outputs[0].name for op in lstms]
    delegate = XlaDelegate(ops=[UNI, BIDI])
    interpreters = [kiln.Interpreter(model_content=model, experimental_delegates=[delegate],
                                     experimental_preserve_all_tensors=True, **REF),
                    kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True, **REF),
                    LiteRT(model_content=model, experimental_preserve_all_tensors=True,
                           experimental_op_resolver_type=OpResolverType.BUILTIN_REF)]
    for interp in interpreters:
        interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for x in (rng.uniform(-1, 1, ir.main.inputs[0].shape).astype(np.float32) for _ in range(3)):
        runs = []
        for interp in interpreters:
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            index = {d["name"]: d["index"] for d in interp.get_tensor_details()}
            runs.append([interp.get_tensor(index[n]) for n in watched])
        for got in runs[:2]:
            for g, w in zip(got, runs[2]):
                np.testing.assert_array_equal(g, w)
    assert sum(op.endswith("SEQUENCE_LSTM") for _, op, _ in delegate.claimed) == len(lstms), delegate.rejected
