"""Hybrid (dynamic-range) UNIDIRECTIONAL_ and BIDIRECTIONAL_SEQUENCE_LSTM: kiln's runtime
against LiteRT's hybrid LSTM kernel (lstm_eval.cc EvalHybrid), bit for bit, in its reference
(BUILTIN_REF) and default resolvers — which run the same kernel — on one-op models with int8
per-tensor weights (every cell feature LiteRT has: CIFG, peephole, projection, layer norm,
clipping, activations, aux inputs, both layouts, symmetric and asymmetric input
quantization), and on the models `kiln.quantize` writes in dynamic-range mode (issue #22:
kiln wrote them and then refused to run them)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.errors import OpError
from kiln.ir import QuantParams
from kiln.kernels import float_math
from kiln.quant import params
from kiln.schema import Activation
from tests.harness import Const, Var, _kernel_outputs, single_op_model
from tests.ops import test_lstm as lstm_cases

UNI_MATRICES = list(range(1, 12)) + [16]
BIDI_MATRICES = list(range(1, 12)) + [16] + list(range(18, 29)) + [33] + list(range(40, 48))


def _hybrid(operands, positions):
    """The float operands with every weight matrix in ``positions`` int8, one scale each."""
    out = list(operands)
    for i in positions:
        o = out[i] if i < len(out) else None
        if isinstance(o, Const) and o.value.dtype == np.float32:
            q, affine = params.symmetric_weights(o.value, None)
            out[i] = Const(q, QuantParams(affine.scale, affine.zero_point))
    return out


def _run(model, feeds, states, interpreter, invokes=2):
    interp = interpreter(model)
    interp.allocate_tensors()
    index = {d["name"]: d["index"] for d in interp.get_tensor_details()}
    for k, value in states.items():
        interp.set_tensor(index[f"var{k}"], value)
    runs = []
    for _ in range(invokes):   # the second run starts from the state the first left
        for d, x in zip(interp.get_input_details(), feeds):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        runs.append([interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()])
    runs.append([interp.get_tensor(index[f"var{k}"]).copy() for k in sorted(states)])
    return runs


def same_as_litert(op_type, operands, options, states, positions):
    """The hybrid one-op model in kiln and in LiteRT (BUILTIN_REF and default): equal bits."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    probe = _kernel_outputs(op_type, operands, options, None)   # shapes from the float kernel
    operands = _hybrid(operands, positions)
    model = single_op_model(op_type, operands, options=options, out_dtypes=[p.dtype for p in probe],
                            out_shapes=[p.shape for p in probe])
    feeds = [np.asarray(x) for x in operands if x is not None and not isinstance(x, (Const, Var))]
    ours = _run(model, feeds, states, lambda m: kiln.Interpreter(model_content=m))
    for kind in (OpResolverType.BUILTIN_REF, OpResolverType.AUTO):
        theirs = _run(model, feeds, states, lambda m: LiteRT(model_content=m, experimental_op_resolver_type=kind))
        for run, (got, want) in enumerate(zip(ours, theirs)):
            for k, (g, w) in enumerate(zip(got, want)):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w, err_msg=f"{op_type} {kind.name} run {run} output {k}")
    return model


UNI = {name: f for name, f in lstm_cases.UNI_FEATURES.items() if "diagonal" not in name}


@pytest.mark.parametrize("asymmetric", [True, False])
@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("features", UNI.values(), ids=UNI.keys())
def test_uni_lstm_equals_litert(features, time_major, asymmetric):
    rng = np.random.default_rng(1)
    operands, states = lstm_cases._uni_lstm(rng, time_major=time_major, n_input=20, n_cell=16, time=5,
                                            **features)
    options = {"fused_activation_function": Activation.TANH, "time_major": time_major,
               "asymmetric_quantize_inputs": asymmetric, "cell_clip": 0.8, "proj_clip": 0.5}
    same_as_litert("UNIDIRECTIONAL_SEQUENCE_LSTM", operands, options, states, UNI_MATRICES)


#: (n_cell, batch, time_major, activation, features) of the odd-sized cases, shared with the
#: XLA lowering's tests (tests/xla/test_hybrid_lstm.py).
ODD_CASES = [
    (5, 3, False, Activation.TANH, "plain"),          # rows at every alignment of LiteRT's buffers
    (7, 3, True, Activation.TANH, "peephole"),
    (6, 3, False, Activation.RELU, "layer_norm"),
    (5, 2, False, Activation.RELU6, "cifg"),
    (6, 2, True, Activation.NONE, "plain"),           # LiteRT's NONE quirk: m = o · g
    (6, 2, False, Activation.NONE, "cifg_peephole"),
    (9, 3, False, Activation.RELU_N1_TO_1, "layer_norm_cifg_peephole_projection"),
    (6, 2, True, Activation.SIGN_BIT, "projection_bias"),
]


def odd_case(n_cell, batch, time_major, activation, features):
    """An ODD_CASES model's operands, states and options; one input row is all zeros (LiteRT
    skips its product)."""
    rng = np.random.default_rng(n_cell * 10 + batch)
    operands, states = lstm_cases._uni_lstm(rng, time_major=time_major, n_input=11, n_cell=n_cell, batch=batch,
                                            time=4, **lstm_cases.UNI_FEATURES[features])
    operands[0][(0, 1) if time_major else (1, 0)] = 0
    options = {"fused_activation_function": activation, "time_major": time_major, "asymmetric_quantize_inputs": True}
    return operands, states, options


@pytest.mark.parametrize("case", ODD_CASES)
def test_uni_lstm_odd_sizes_and_activations(case):
    operands, states, options = odd_case(*case)
    same_as_litert("UNIDIRECTIONAL_SEQUENCE_LSTM", operands, options, states, UNI_MATRICES)


@pytest.mark.parametrize("merge", [False, True])
@pytest.mark.parametrize("time_major", [True, False])
@pytest.mark.parametrize("case", lstm_cases.BIDI_CASES.values(), ids=lstm_cases.BIDI_CASES.keys())
def test_bidi_lstm_equals_litert(case, time_major, merge):
    rng = np.random.default_rng(12)
    # batch-major merged outputs with batch > 1: LiteRT reads past its state tensors (kiln.ops.lstm)
    batch = 1 if merge and not time_major else 2
    n_input = 3 if case.get("aux") and not case.get("aux_weights") else 9
    operands, states = lstm_cases._bidi_lstm(rng, time_major=time_major, n_input=n_input, n_cell=6, batch=batch,
                                             time=4, **case)
    options = {"fused_activation_function": Activation.TANH, "time_major": time_major, "merge_outputs": merge,
               "asymmetric_quantize_inputs": True}
    same_as_litert("BIDIRECTIONAL_SEQUENCE_LSTM", operands, options, states, BIDI_MATRICES)


def test_refusals_name_the_operand():
    rng = np.random.default_rng(3)
    operands, _ = lstm_cases._uni_lstm(rng, n_input=4, n_cell=4, time=2, diagonal=True)
    operands = _hybrid(operands, UNI_MATRICES)
    model = single_op_model("UNIDIRECTIONAL_SEQUENCE_LSTM", operands, out_dtypes=[np.float32], out_shapes=[(2, 2, 4)],
                            options={"diagonal_recurrent_tensors": True, "fused_activation_function": 4})
    interp = kiln.Interpreter(model_content=model)
    interp.allocate_tensors()
    with pytest.raises(OpError, match="diagonal recurrent weights have no hybrid kernel"):
        interp.invoke()


@pytest.mark.parametrize("activation", ["tanh", "logistic"])
def test_eigen_activations_equal_litert(activation):
    """kiln.kernels.float_math equals LiteRT's float TANH / LOGISTIC (Eigen) on every input
    of a dense sweep, tails of odd lengths included (Eigen's scalar path)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    rng = np.random.default_rng(4)
    for x in (np.concatenate([rng.uniform(-12, 12, 20000), rng.standard_normal(20000) * 1e-3,
                              np.linspace(-20, 20, 4001)]).astype(np.float32), rng.uniform(-8, 8, 7).astype(np.float32)):
        model = single_op_model(activation.upper() if activation == "tanh" else "LOGISTIC", [x])
        interp = LiteRT(model_content=model,
                        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        want = interp.get_tensor(interp.get_output_details()[0]["index"])
        got = float_math.tanh(x) if activation == "tanh" else float_math.logistic(x)
        np.testing.assert_array_equal(got, want)


# -- the models kiln writes ---------------------------------------------------------------------

def _keras_lstm(name: str):
    """Sequence models whose LSTMs pass the 1024-weight threshold: Keras 3 LSTM, Keras 3
    Bidirectional(LSTM) and tf_keras LSTM, 12 steps of 10 features."""
    if name == "tfk_lstm":
        tf_keras = pytest.importorskip("tf_keras")
        tf_keras.utils.set_random_seed(5)
        L = tf_keras.layers
        return tf_keras.Sequential([L.InputLayer((12, 10), batch_size=1), L.LSTM(24, return_sequences=True),
                                    L.Dense(3)])
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(5)
    L = keras.layers
    rnn = L.LSTM(24, return_sequences=True) if name == "k3_lstm" else L.Bidirectional(L.LSTM(16))
    return keras.Sequential([keras.Input((12, 10), batch_size=1), rnn, L.Dense(3)])


def _converted(name: str, **attributes) -> bytes:
    pytest.importorskip("tensorflow")
    conv = kiln.TFLiteConverter.from_keras_model(_keras_lstm(name))
    for key, value in attributes.items():
        setattr(conv, key, value)
    return conv.convert()


@pytest.mark.parametrize("name", ["k3_lstm", "k3_bilstm", "tfk_lstm"])
def test_dynamic_range_lstm_models_run_as_in_litert(name):
    """The converter's and `kiln.quantize`'s dynamic-range LSTM models (Keras 3, Bidirectional,
    tf_keras): hybrid LSTMs whose outputs in kiln's Interpreter are LiteRT's, bit for bit; the
    debugger's default runner (kiln's Interpreter) takes them too."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType

    float_model = _converted(name)
    rng = np.random.default_rng(0)
    for model in (_converted(name, optimizations=[kiln.Optimize.DEFAULT]), kiln.quantize(float_model, "dynamic")):
        ir = kiln.read_model(model)
        lstms = [op for op in ir.main.operators if op.op_type.endswith("SEQUENCE_LSTM")]
        assert lstms and all(op.inputs[2].dtype.name == "INT8" and op.version == 3 for op in lstms)
        watched = [op.outputs[0].name for op in lstms]
        shape = ir.main.inputs[0].shape
        for x in (rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(2)):
            runs = []
            for interp in (kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True),
                           LiteRT(model_content=model, experimental_preserve_all_tensors=True,
                                  experimental_op_resolver_type=OpResolverType.BUILTIN_REF)):
                interp.allocate_tensors()
                interp.set_tensor(interp.get_input_details()[0]["index"], x)
                interp.invoke()
                index = {d["name"]: d["index"] for d in interp.get_tensor_details()}
                runs.append([interp.get_tensor(index[n]) for n in watched] +
                            [interp.get_tensor(d["index"]) for d in interp.get_output_details()])
            ours, theirs = runs
            for g, w in zip(ours[:len(watched)], theirs):     # the hybrid LSTMs: LiteRT's bits
                np.testing.assert_array_equal(g, w)
            for g, w in zip(ours[len(watched):], theirs[len(watched):]):   # after the float Dense
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    samples = [[rng.uniform(-1, 1, shape).astype(np.float32)] for _ in range(2)]   # of the last model
    debugger = kiln.QuantizationDebugger(float_model, model, samples)
    assert debugger.outputs and np.isfinite(debugger.outputs[0].errors.max_abs_error)


def test_weight_only_covers_fused_lstm_weights():
    """weight_only: every LSTM weight matrix int8 behind DEQUANTIZE (listed as quantized), the
    LSTM itself float; an LSTM too small is listed as kept float with the reason."""
    from kiln.quant.api import quantize_model

    float_model = _converted("k3_lstm")
    ir = kiln.read_model(float_model)
    report = quantize_model(ir, "weight_only", min_elements=16)
    (lstm,) = [op for op in ir.main.operators if op.op_type == "UNIDIRECTIONAL_SEQUENCE_LSTM"]
    matrices = [i for i in range(1, 9)]
    assert all(lstm.inputs[i].producer.op_type == "DEQUANTIZE" for i in matrices)
    assert all(lstm.inputs[i].dtype.name == "FLOAT32" for i in matrices) and lstm.version == 1
    assert sum(op == "UNIDIRECTIONAL_SEQUENCE_LSTM" for op, _ in report.quantized) == len(matrices)
    model = kiln.write_model(ir)
    x = np.random.default_rng(1).uniform(-1, 1, ir.main.inputs[0].shape).astype(np.float32)
    from tests.quant.zoo_models import builtin_ref, invoke

    np.testing.assert_allclose(invoke(kiln.Interpreter(model_content=model), x)[0], invoke(builtin_ref(model), x)[0],
                               atol=2e-6)
    small = quantize_model(kiln.read_model(float_model), "weight_only", min_elements=10 ** 6)
    assert any(op == "UNIDIRECTIONAL_SEQUENCE_LSTM" and "weights <" in why for op, _, why in small.kept_float)
