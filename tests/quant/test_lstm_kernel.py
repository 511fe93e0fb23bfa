"""kiln's integer UNIDIRECTIONAL_SEQUENCE_LSTM kernel (kiln.kernels.lstm) against LiteRT's
BUILTIN_REF: the LSTM's int8 output and its variable state tensors (int8 hidden, int16 cell)
bit for bit, invoke after invoke, on kiln's int8 and 16x8 LSTMs (Keras 3, tf_keras,
Bidirectional split in two, stacked) and on TF's own int8 tf_keras LSTMs; batch > 1 and a
resized batch; bad operands refused by node."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.errors import OpError
from kiln.quant import quantize
from tests.quant import zoo_models
from tests.quant.zoo_models import FEATURES, T
from tests.quant.zoo_models import lstm_inputs

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

LSTM = "UNIDIRECTIONAL_SEQUENCE_LSTM"


def _k3(layers_fn, seed, batch_size=1):
    keras.utils.set_random_seed(seed)
    x = keras.Input((T, FEATURES), batch_size=batch_size)
    return kiln.TFLiteConverter.from_keras_model(keras.Model(x, layers_fn(keras.layers)(x))).convert()


def _int8(float_model, mode="int8", seed=0):
    return quantize(float_model, mode, representative_dataset=lstm_inputs(16, seed), progress=False)


@pytest.fixture(scope="module")
def models():
    """name -> quantized model, built once."""
    k3 = _k3(lambda L: lambda x: L.Dense(3)(L.LSTM(8)(x)), 0)
    tf_keras.utils.set_random_seed(1)
    tfk = tf_keras.Sequential([tf_keras.layers.InputLayer((T, FEATURES), batch_size=1),
                               tf_keras.layers.LSTM(8, return_sequences=True), tf_keras.layers.Dense(3)])
    tf_models = zoo_models.tf_int8_lstms()
    return {
        "k3_int8": _int8(k3),
        "k3_16x8": _int8(k3, "int16x8"),
        "tf_keras_int8": _int8(tf.lite.TFLiteConverter.from_keras_model(tfk).convert()),
        "bidirectional": _int8(_k3(lambda L: lambda x: L.Dense(3)(
            L.Bidirectional(L.LSTM(6, return_sequences=True))(x)), 2)),
        "stacked": _int8(_k3(lambda L: lambda x: L.LSTM(6)(L.LSTM(8, return_sequences=True)(x)), 3)),
        "free_batch": _int8(_k3(lambda L: lambda x: L.Dense(3)(L.LSTM(8)(x)), 4, batch_size=None)),
        # TF's converter: 16 samples give a cell scale of 2^-16 (LiteRT's skipped-tanh quirk)
        "tf_int8_calib16": tf_models["calib16"],
        "tf_int8_calib64": tf_models["calib64"],
    }


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the integer kernel's runs (the delegates must leave LSTM nodes to it)."""
    table = ops.get(LSTM).quantized
    calls = []
    kernel = table["int8"]

    def counted(*args):
        calls.append(1)
        return kernel(*args)

    monkeypatch.setitem(table, "int8", counted)
    return calls


def _lstms(model: bytes):
    return [op for op in kiln.read_model(model).main.operators if op.op_type == LSTM]


def _watched(model: bytes) -> list[str]:
    """Names of every LSTM's output and state tensors."""
    return [t.name for op in _lstms(model) for t in (op.outputs[0], op.inputs[18], op.inputs[19])]


def _interpreters(model: bytes, batch: int | None = None):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                      experimental_preserve_all_tensors=True)
    ours = kiln.Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    for interp in (ref, ours):
        if batch is not None:
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, T, FEATURES])
        interp.allocate_tensors()
    return ref, ours


def _index(interp, name: str) -> int:
    return next(d["index"] for d in interp.get_tensor_details() if d["name"] == name)


def _check_bit_exact(model: bytes, inputs, interpreters=None) -> int:
    """Invoke both runtimes on each input in turn (states carried between invokes); the
    outputs, every LSTM's int8 output and its state tensors agree bit for bit. Returns how
    many LSTM states were compared."""
    ref, ours = interpreters or _interpreters(model)
    names = _watched(model)
    for k, x in enumerate(inputs):
        for interp in (ref, ours):
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
        for name in names:
            want, got = ref.get_tensor(_index(ref, name)), ours.get_tensor(_index(ours, name))
            assert got.dtype == want.dtype and want.dtype in (np.int8, np.int16), name
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, invoke {k}")
        for d_ref, d_ours in zip(ref.get_output_details(), ours.get_output_details()):
            np.testing.assert_array_equal(ours.get_tensor(d_ours["index"]), ref.get_tensor(d_ref["index"]))
    return len(names)


@pytest.mark.parametrize("name, n_lstms", [
    ("k3_int8", 1), ("k3_16x8", 1), ("tf_keras_int8", 1), ("bidirectional", 2), ("stacked", 2),
    ("tf_int8_calib16", 1), ("tf_int8_calib64", 1),
])
def test_integer_lstm_bit_exact_with_builtin_ref(models, kernel_calls, name, n_lstms):
    model = models[name]
    lstms = _lstms(model)
    assert len(lstms) == n_lstms
    assert all(op.inputs[0].dtype.name == "INT8" and op.inputs[19].dtype.name == "INT16" for op in lstms)
    inputs = [x * 1.5 for x in lstm_inputs(4, 7)]      # past the calibrated range too
    assert _check_bit_exact(model, inputs) == 3 * n_lstms
    assert len(kernel_calls) == n_lstms * len(inputs)


def test_tf_cell_scale_below_2_pow_minus_15_is_litert_quirk(models):
    """TF's 16-sample model has the cell scale 2^-16: LiteRT's tanh is skipped there, kiln
    reproduces it (the bit-exact test above); the 64-sample model's is 2^-15."""
    scales = [_lstms(models[k])[0].inputs[19].quantization.scale[0] for k in ("tf_int8_calib16", "tf_int8_calib64")]
    assert scales[0] == 2.0 ** -16 and scales[1] >= 2.0 ** -15


@pytest.mark.parametrize("batches", [(2,), (3, 1)])
def test_batch_and_resized_batch(models, kernel_calls, batches):
    model = models["free_batch"]
    ref, ours = _interpreters(model, batches[0])
    for k, batch in enumerate(batches):
        if k:
            for interp in (ref, ours):
                interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, T, FEATURES])
                interp.allocate_tensors()
        _check_bit_exact(model, lstm_inputs(3, 10 + k, batch), (ref, ours))
    assert len(kernel_calls) >= 3 * len(batches)   # (a free batch: kiln may also run it to infer shapes)


def _broken(model: bytes, change) -> bytes:
    m = kiln.read_model(model)
    op = next(op for op in m.main.operators if op.op_type == LSTM)
    change(op)
    return kiln.write_model(m)


def _invoke(model: bytes):
    interp = kiln.Interpreter(model_content=model)
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()


def _drop_intermediates(op):
    op.intermediates = []


def _int8_bias(op):
    b = op.inputs[13]
    op.set_input(13, op.subgraph.add_constant(b.name + "_int8", b.data.astype(np.int8), quantization=b.quantization))


def _cell_state_scale(op):
    op.inputs[19].quantization.scale[0] = np.float32(3e-5)


def _peephole_projection():
    """LiteRT's integer peephole walks the cell state in rows of n_output: refused when that is
    not n_cell."""
    return one_lstm(0, peephole=True, n_output=4)[0]


def test_peephole_with_a_narrower_projection_is_refused():
    with pytest.raises(OpError, match="peephole with a projection to 4 != 7 cells") as info:
        _invoke(_peephole_projection())
    assert LSTM in str(info.value)


@pytest.mark.parametrize("change, message", [
    (_drop_intermediates, "5 intermediate tensors"),
    (_int8_bias, r"operand 13 \(bias of forget\) must be int32, got int8"),
    (_cell_state_scale, "not a power of two"),
])
def test_bad_operands_are_refused_by_node(models, change, message):
    bad = _broken(models["k3_int8"], change)
    with pytest.raises(OpError, match=message) as info:
        _invoke(bad)
    assert LSTM in str(info.value)


# -- one-op integer LSTMs built directly: layouts and parameters Keras models do not reach ----------

def _qp(scale, zero_point=0):
    from kiln.ir import QuantParams

    return QuantParams(np.asarray([scale], np.float32), np.asarray([zero_point], np.int64))


def one_lstm(seed, *, time_major=False, batch=2, steps=4, n_input=5, n_cell=7, x_zp=-3, h_zp=9,
             cell_power=1, cell_clip=0.0, cifg=False, peephole=False, n_output=None, proj_clip=0.0,
             proj_bias=True) -> tuple[bytes, tuple]:
    """An int8 UNIDIRECTIONAL_SEQUENCE_LSTM alone: random int8 weights, int32 biases, int16
    peepholes, an int8 projection to ``n_output`` (None: none), variable states, TF's five
    intermediates. Returns the model and the input shape."""
    from kiln.ir import Model, Operator
    from kiln.schema import DType

    rng = np.random.default_rng(seed)
    x_scale, h_scale, hidden_scale = 0.02, 0.008, 0.007
    projected = n_output is not None
    n_out = n_output if projected else n_cell
    model = Model()
    sg = model.add_subgraph("main")
    shape = (steps, batch, n_input) if time_major else (batch, steps, n_input)
    x = sg.add_tensor("x", DType.INT8, shape, quantization=_qp(x_scale, x_zp))
    sg.inputs.append(x)

    def const(name, value, scale):
        return sg.add_constant(name, value, quantization=None if scale is None else _qp(scale))

    ins = [x]
    for k in range(8):
        cols = n_input if k < 4 else n_out
        w = const(f"w{k}", rng.integers(-127, 128, (n_cell, cols)).astype(np.int8), float(rng.uniform(0.002, 0.02)))
        ins.append(None if cifg and k in (0, 4) else w)
    for k in range(3):
        w = const(f"p{k}", rng.integers(-20000, 20000, n_cell).astype(np.int16), float(rng.uniform(1e-5, 1e-4)))
        ins.append(w if peephole and not (cifg and k == 0) else None)
    for k in range(4):
        w_scale = 0.01 if ins[1 + k] is None else float(ins[1 + k].quantization.scale[0])
        b = const(f"b{k}", rng.integers(-3000, 3000, n_cell).astype(np.int32), x_scale * w_scale)
        ins.append(None if cifg and k == 0 else b)
    if projected:
        ins.append(const("pw", rng.integers(-127, 128, (n_output, n_cell)).astype(np.int8), 0.01))
        ins.append(const("pb", rng.integers(-500, 500, n_output).astype(np.int32), None) if proj_bias else None)
    else:
        ins += [None, None]
    ins.append(sg.add_tensor("h", DType.INT8, (batch, n_out), quantization=_qp(h_scale, h_zp), is_variable=True))
    ins.append(sg.add_tensor("c", DType.INT16, (batch, n_cell), quantization=_qp(2.0 ** cell_power / 32768),
                             is_variable=True))
    ins += [None] * 4
    y = sg.add_tensor("y", DType.INT8, shape[:2] + (n_out,), quantization=_qp(h_scale, h_zp))
    sg.outputs.append(y)
    op = Operator(LSTM, options={"fused_activation_function": 4, "cell_clip": cell_clip, "proj_clip": proj_clip,
                                 "time_major": time_major})
    sg.add_operator(op, ins, [y])
    op.intermediates = [sg.add_tensor(f"i{k}", DType.FLOAT32, (0,)) for k in range(4)]
    hidden_zp = -5 if projected else h_zp
    op.intermediates.append(sg.add_tensor("hidden", DType.INT8, (0,),
                                          quantization=_qp(hidden_scale if projected else h_scale, hidden_zp)))
    op.version = ops.require(LSTM).version(op)
    return kiln.write_model(model), shape


@pytest.mark.parametrize("case", [
    dict(time_major=True), dict(time_major=False, batch=1), dict(time_major=True, batch=3, x_zp=0, h_zp=-128),
    dict(cell_power=-1), dict(cell_power=0), dict(cell_power=4), dict(cell_power=6),
    dict(cell_clip=0.3), dict(cell_clip=0.2, cell_power=2), dict(n_input=1, n_cell=1, steps=1),
    dict(cifg=True), dict(cifg=True, cell_power=0, time_major=True), dict(peephole=True),
    dict(peephole=True, cifg=True, cell_power=3), dict(peephole=True, cell_power=-1),
    dict(n_output=4), dict(n_output=9, proj_clip=0.4, proj_bias=False), dict(n_output=7, peephole=True, cifg=True),
])
def test_one_op_lstms_bit_exact(kernel_calls, case):
    """Time-major and batch-major, batches, zero points, every cell scale LiteRT computes
    (2^-16, the skipped-tanh quirk, to 2^-9), cell clipping, CIFG, peepholes, projection."""
    model, shape = one_lstm(sum(map(ord, repr(case))), **case)
    rng = np.random.default_rng(1)
    inputs = [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(3)]
    _check_bit_exact(model, inputs)
    assert len(kernel_calls) == 3


# -- the converter zoo's LSTMs (free batch), as tests/quant/test_runtime_models.py checks models -----

@pytest.mark.parametrize("name", ["k3_lstm", "k3_lstm_stacked_states", "k3_bilstm"])
def test_zoo_lstms_quantized_by_kiln_run_as_builtin_ref(kernel_calls, name):
    """kiln's int8 and 16x8 quantizations of the zoo's Keras 3 LSTMs (kiln's converter: TF's
    needs a static batch) run in kiln's default runtime as in LiteRT's BUILTIN_REF. An LSTM
    whose states the model returns stays float (the quantizer refuses it): its outputs agree
    to float rounding, the integer ones bit for bit."""
    calibration, held_out = zoo_models.data(name, 3, 8, 4)
    float_model = kiln.TFLiteConverter.from_keras_model(zoo_models.keras_model(name)).convert()
    for i, mode in enumerate(("int8", "int16x8")):     # two held-out inputs each
        q = zoo_models.kiln_quantize(float_model, mode, calibration)
        lstms = _lstms(q)
        integer = [op.inputs[0].dtype.name == "INT8" for op in lstms]
        assert any(integer) and integer == [name != "k3_lstm_stacked_states" or k == 0 for k in range(len(lstms))]
        zoo_models.compare_with_builtin_ref(q, held_out[2 * i:2 * i + 2], exact=all(integer))
    assert kernel_calls
