"""The full-integer UNIDIRECTIONAL_SEQUENCE_LSTM through XlaDelegate (kiln/xla/lower_quant_lstm.py,
one lax.scan): claimed, and bit for bit with LiteRT's BUILTIN_REF and kiln's reference kernel
— outputs and the variable state tensors, invoke after invoke — on kiln's int8 Keras 3 LSTMs
(batch 1 and a resized free batch) and TF's own int8 tf_keras LSTM (cell scale 2^-16: the
skipped-tanh quirk)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")

import kiln  # noqa: E402
from kiln.quant import quantize  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.harness import feed  # noqa: E402
from tests.quant import zoo_models  # noqa: E402
from tests.quant.zoo_models import FEATURES, T  # noqa: E402

LSTM = "UNIDIRECTIONAL_SEQUENCE_LSTM"


def _data(count, seed, batch=1):
    return zoo_models.lstm_inputs(count, seed, batch, bound=1.5)


@pytest.fixture(scope="module")
def models():
    keras.utils.set_random_seed(0)
    x = keras.Input((T, FEATURES), batch_size=None)
    L = keras.layers
    m = keras.Model(x, L.Dense(3)(L.LSTM(6)(L.LSTM(8, return_sequences=True)(x))))
    float_model = kiln.TFLiteConverter.from_keras_model(m).convert()
    calibration = [d[:1] for d in _data(16, 1)]
    return {"float_stacked": float_model,
            "kiln_stacked": quantize(float_model, "int8", representative_dataset=calibration, progress=False),
            "tf_calib16": zoo_models.tf_int8_lstms()["calib16"]}


def _states(model: bytes) -> list[str]:
    ops = kiln.read_model(model).main.operators
    return [op.inputs[k].name for op in ops if op.op_type == LSTM for k in (18, 19)]


def _read(interp, names):
    details = {d["name"]: d["index"] for d in interp.get_tensor_details()}
    return [interp.get_tensor(details[n]) for n in names]


@pytest.mark.parametrize("name, batches", [("kiln_stacked", (1,)),
                                           ("kiln_stacked", (3, 2)),
                                           ("tf_calib16", (1,))])
def test_integer_lstm_lowering_is_bit_exact(models, name, batches):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    model = models[name]
    delegate = XlaDelegate()
    xla = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
    kernel = kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    states = _states(model)
    for k, batch in enumerate(batches):
        for interp in (ref, xla, kernel):
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, T, FEATURES])
            interp.allocate_tensors()
        for x in _data(3, 5 + k, batch):
            want = feed(ref, [x], allocate=False)
            for interp in (xla, kernel):
                np.testing.assert_array_equal(feed(interp, [x], allocate=False)[0], want[0])
            for a, b in zip(_read(xla, states), _read(kernel, states)):
                assert a.dtype == b.dtype and a.dtype in (np.int8, np.int16)
                np.testing.assert_array_equal(a, b)
    lstms = sum(op.op_type == LSTM for op in kiln.read_model(model).main.operators)
    assert sum(op == LSTM for _, op, _ in delegate.claimed) == lstms, delegate.rejected


@pytest.mark.parametrize("delegate", ["xla", "numpy"])
def test_float_lstm_states_read_back_from_a_whole_model_partition(models, delegate):
    """The float stacked LSTM runs as one partition, its states started by FILLs inside it:
    get_tensor after an invoke reads the final states, as on the reference kernels."""
    model = models["float_stacked"]
    from kiln.delegates import NumpyDelegate

    chosen = XlaDelegate() if delegate == "xla" else NumpyDelegate()
    fast = kiln.Interpreter(model_content=model, experimental_delegates=[chosen])
    ref = kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    states = _states(model)
    for x in _data(2, 7):
        np.testing.assert_allclose(feed(fast, [x])[0], feed(ref, [x])[0], rtol=1e-5, atol=1e-6)
        for got, want in zip(_read(fast, states), _read(ref, states)):
            assert np.abs(want).max() > 0.01
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sum(op == LSTM for _, op, _ in chosen.claimed) == 2, chosen.rejected
    if delegate == "xla":
        assert len(chosen.kernels) == 1 and not chosen.rejected, chosen.rejected


@pytest.mark.parametrize("case", [
    dict(time_major=True, batch=3), dict(cell_power=-1), dict(cell_clip=0.3, cifg=True),
    dict(peephole=True, n_output=7, proj_clip=0.4), dict(n_output=4, x_zp=0, h_zp=-128),
])
def test_one_op_integer_lstms_through_xla(case):
    """Layouts Keras models do not reach (tests/quant/test_lstm_kernel.py's builder): XLA,
    kiln's kernel and LiteRT agree on the output and the states over invokes."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tests.quant.test_lstm_kernel import one_lstm

    model, shape = one_lstm(sum(map(ord, repr(case))), **case)
    delegate = XlaDelegate()
    xla = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
    ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    for interp in (xla, ref):
        interp.allocate_tensors()
    assert [op for _, op, _ in delegate.claimed] == [LSTM], delegate.rejected
    rng = np.random.default_rng(2)
    for _ in range(3):
        x = rng.integers(-128, 128, shape).astype(np.int8)
        np.testing.assert_array_equal(feed(xla, [x], allocate=False)[0], feed(ref, [x], allocate=False)[0])
        for got, want in zip(_read(xla, ["h", "c"]), _read(ref, ["h", "c"])):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_to_jax_runs_tfs_int8_lstm_from_litert_initial_state(models):
    """to_jax's variables start as LiteRT's do: TF's int8 hidden state at its zero point."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from kiln.xla import to_jax

    model = models["tf_calib16"]
    assert kiln.read_model(model).main.operators[1].inputs[18].quantization.zero_point[0] != 0
    fn, params = to_jax(model)
    for x in _data(2, 9):
        ref = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        np.testing.assert_array_equal(np.asarray(fn(params, x)[0]), feed(ref, [x])[0])
