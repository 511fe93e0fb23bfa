"""kiln's Interpreter against LiteRT on models TensorFlow's converter wrote.

Each zoo model runs in both interpreters through the tf.lite API and through signature
runners; outputs must agree within 1e-5 of the output's scale, and the introspection API
(details dicts, op lists) must describe the model the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.ops
from kiln.format import read_model
from kiln.ops.record import KernelCall
from tests.harness import assert_close, run_api
from tests.runtime.conftest import litert
from tests.runtime.zoo import ZOO, sample_inputs

MODELS = list(ZOO)
RTOL, ATOL = 1e-5, 1e-7
#: End to end, float32 rounding differences (GEMM summation order) compound over depth:
#: MobileNetV2's 52 convolutions with folded batch norms amplify kiln's <5e-7 per-op
#: difference to ~3e-5 of the output scale. test_each_op_matches_litert_in_isolation holds
#: every op of every zoo model to RTOL on LiteRT's own intermediate values.
E2E_RTOL = {"mobilenet": 1e-4}
STATEFUL = {"WHILE", "IF", "CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"}
DETAIL_KEYS = {"name", "index", "shape", "shape_signature", "dtype", "quantization",
               "quantization_parameters", "sparsity_parameters"}


@pytest.mark.parametrize("name", MODELS)
def test_outputs_match_litert(zoo, name):
    data = zoo.bytes(name)
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    ref.allocate_tensors()
    for seed in (0, 1):  # the second invoke reuses the prepared plan
        inputs = sample_inputs(ref.get_input_details(), seed)
        expected, actual = run_api(ref, inputs), run_api(ours, inputs)
        assert len(actual) == len(expected)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol=E2E_RTOL.get(name, RTOL), atol=ATOL, what=f"{name} output {k} (seed {seed})")


@pytest.mark.parametrize("name", MODELS)
def test_each_op_matches_litert_in_isolation(zoo, name):
    """Every main-subgraph op, fed LiteRT's own intermediate values, reproduces LiteRT's result."""
    data = zoo.bytes(name)
    ref = litert(data, experimental_preserve_all_tensors=True)
    run_api(ref, sample_inputs(litert(data).get_input_details(), 0))
    graph = read_model(data).main
    pos = graph.tensor_index()
    checked = 0
    for oi, op in enumerate(graph.operators):
        if op.op_type in STATEFUL or any(t is not None and t.is_variable for t in op.inputs):
            continue  # control flow and state: covered end to end
        record = kiln.ops.get(op.op_type)
        args = [None if t is None else (t.data if t.is_constant else ref.get_tensor(pos[id(t)])) for t in op.inputs]
        call = KernelCall(record.make_options(op.options), op, [np.dtype(t.dtype.numpy) for t in op.outputs])
        result = record.kernel(call, *args)
        for k, (t, value) in enumerate(zip(op.outputs, result if isinstance(result, tuple) else (result,))):
            assert_close(np.asarray(value), ref.get_tensor(pos[id(t)]), rtol=RTOL, atol=ATOL,
                         what=f"{name} node {oi} ({op.name}) output {k}")
            checked += 1
    assert checked


@pytest.mark.parametrize("name", MODELS)
def test_zoo_models_depend_on_their_inputs(zoo, name):
    """A model whose output ignores its input (vanished activations) would prove nothing."""
    ref = litert(zoo.bytes(name))
    ref.allocate_tensors()
    first, second = (run_api(ref, sample_inputs(ref.get_input_details(), seed)) for seed in (0, 1))
    for a, b in zip(first, second):
        assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()


@pytest.mark.parametrize("name", MODELS)
def test_signature_runners_match(zoo, name):
    data = zoo.bytes(name)
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    assert ours.get_signature_list() == ref.get_signature_list()
    # Every signature twice, in one interpreter each: state (variables) carries across calls.
    for step, key in enumerate(list(ref.get_signature_list()) * 2):
        r, o = ref.get_signature_runner(key), ours.get_signature_runner(key)
        assert sorted(o.get_input_details()) == sorted(r.get_input_details())
        inputs = dict(zip(r.get_input_details(), sample_inputs(r.get_input_details(), step)))
        expected, actual = r(**inputs), o(**inputs)
        assert sorted(actual) == sorted(expected)
        for out in expected:
            assert_close(actual[out], expected[out], rtol=E2E_RTOL.get(name, RTOL), atol=ATOL,
                         what=f"{name}/{key}/{out}")


def _same_details(ours: dict, ref: dict, where: str):
    assert set(ours) == set(ref), f"{where}: keys {sorted(ours)} vs {sorted(ref)}"
    assert ours["name"] == ref["name"], where
    assert ours["index"] == ref["index"], where
    np.testing.assert_array_equal(ours["shape"], ref["shape"], err_msg=where)
    assert ours["shape"].dtype == ref["shape"].dtype, where
    np.testing.assert_array_equal(ours["shape_signature"], ref["shape_signature"], err_msg=where)
    assert ours["dtype"] == ref["dtype"], where
    assert ours["quantization"] == ref["quantization"], where
    assert set(ours["quantization_parameters"]) == set(ref["quantization_parameters"]), where


@pytest.mark.parametrize("name", MODELS)
def test_details_match(zoo, name):
    data = zoo.bytes(name)
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    inputs = sample_inputs(ref.get_input_details())
    run_api(ref, inputs)
    run_api(ours, inputs)
    for kind in ("get_input_details", "get_output_details"):
        r, o = getattr(ref, kind)(), getattr(ours, kind)()
        assert len(o) == len(r)
        for k, (a, b) in enumerate(zip(o, r)):
            assert set(a) == DETAIL_KEYS
            _same_details(a, b, f"{name} {kind}[{k}]")
    # LiteRT appends its kernels' unnamed scratch tensors (im2col, LSTM scratch) after the
    # model's own tensors; kiln has none.
    r_all, o_all = ref.get_tensor_details(), ours.get_tensor_details()
    assert all(d["name"] in ("", "BatchMatMul_scratch_buffer") for d in r_all[len(o_all):])
    assert ours.num_subgraphs() == ref.num_subgraphs()
    for sg in range(ref.num_subgraphs()):
        o_all = ours.get_tensor_details(sg)
        r_all = ref.get_tensor_details(sg)[:len(o_all)]
        assert [d["name"] for d in o_all] == [d["name"] for d in r_all]
        for a, b in zip(o_all, r_all):  # after invoke, intermediates have their computed shapes
            where = f"{name} subgraph {sg} tensor {b['index']} {b['name']!r}"
            assert set(a) == set(b), where
            assert a["dtype"] == b["dtype"], where
            np.testing.assert_array_equal(a["shape"], b["shape"], err_msg=where)
            np.testing.assert_array_equal(a["shape_signature"], b["shape_signature"], err_msg=where)


@pytest.mark.parametrize("name", MODELS)
def test_ops_details_match(zoo, name):
    data = zoo.bytes(name)
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    ref.allocate_tensors()
    ours.allocate_tensors()
    r, o = ref._get_ops_details(), ours._get_ops_details()
    assert [d["op_name"] for d in o] == [d["op_name"] for d in r]
    for a, b in zip(o, r):
        assert a["index"] == b["index"]
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        # LiteRT reports WHILE outputs nobody reads as -1; kiln reports the file's tensors.
        assert len(a["outputs"]) == len(b["outputs"])
        for x, y in zip(a["outputs"], b["outputs"]):
            assert x == y or (y == -1 and b["op_name"] == "WHILE"), (name, a["op_name"])


def test_resize_dynamic_batch(zoo):
    data = zoo.bytes("dynamic_batch")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    (d,) = ours.get_input_details()
    assert list(d["shape_signature"]) == [-1, 8, 8, 3]
    for batch in (3, 1, 7):
        for interp in (ref, ours):
            interp.resize_tensor_input(d["index"], [batch, 8, 8, 3], strict=True)
        x = sample_inputs(ours.get_input_details(), batch, batch=batch)
        (e,), (a,) = run_api(ref, x), run_api(ours, x)
        assert a.shape == (batch, 5)
        assert_close(a, e, rtol=RTOL, atol=ATOL, what=f"batch {batch}")
        assert list(ours.get_output_details()[0]["shape"]) == list(ref.get_output_details()[0]["shape"])
        assert list(ours.get_input_details()[0]["shape"]) == [batch, 8, 8, 3]


def test_strict_resize_refuses_static_dims(zoo):
    ours = kiln.Interpreter(model_content=zoo.bytes("dynamic_batch"))
    idx = ours.get_input_details()[0]["index"]
    with pytest.raises(kiln.InterpreterError, match="only allows mutating unknown dimensions"):
        ours.resize_tensor_input(idx, [2, 9, 8, 3], strict=True)
    ours.resize_tensor_input(idx, [2, 9, 9, 3])  # non-strict may change any dim...
    ours.allocate_tensors()
    ours.set_tensor(idx, np.zeros((2, 9, 9, 3), np.float32))
    ours.invoke()  # ...and this model (conv + global pool) still runs
    assert ours.get_tensor(ours.get_output_details()[0]["index"]).shape == (2, 5)


def test_set_tensor_errors_name_the_input(zoo):
    ours = kiln.Interpreter(model_content=zoo.bytes("mlp"))
    ours.allocate_tensors()
    idx = ours.get_input_details()[0]["index"]
    with pytest.raises(kiln.InterpreterError, match="Dimension mismatch. Got 3 but expected 20 for dimension 1"):
        ours.set_tensor(idx, np.zeros((1, 3), np.float32))
    with pytest.raises(kiln.InterpreterError, match="Got value of type INT32 but expected type FLOAT32"):
        ours.set_tensor(idx, np.zeros((1, 20), np.int32))


def _invoke_thrice_with_reset(interp, x):
    interp.allocate_tensors()
    outs = []
    for step in range(3):
        if step == 2:
            interp.reset_all_variables()
        outs.append(run_api(interp, [x])[0])
    return outs


@pytest.mark.parametrize("name", ["lstm", "bilstm"])
def test_reset_all_variables_restarts_lstm_state(zoo, name):
    """Sequence-LSTM state lives in variable tensors and carries over invocations until reset."""
    data = zoo.bytes(name)
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    x = sample_inputs(ref.get_input_details(), 3)[0]
    expected, actual = _invoke_thrice_with_reset(ref, x), _invoke_thrice_with_reset(ours, x)
    assert not np.allclose(actual[1], actual[0])  # the state carried over
    np.testing.assert_array_equal(actual[2], actual[0])
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert_close(a, e, rtol=RTOL, atol=ATOL, what=f"{name} call {k}")


def test_reset_all_variables_keeps_resource_variables(zoo):
    """LiteRT resets variable tensors only; resource variables keep accumulating."""
    data = zoo.bytes("variables")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    x = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    history = {}
    for tag, interp in (("ref", ref), ("ours", ours)):
        acc = interp.get_signature_runner("accumulate")
        first, second = acc(**x), acc(**x)
        interp.reset_all_variables()
        history[tag] = (first, second, acc(**x))
    for a, e in zip(history["ours"], history["ref"]):
        for out in e:
            assert_close(a[out], e[out], rtol=RTOL, atol=ATOL, what=out)
    np.testing.assert_array_equal(history["ours"][2]["total"], 0.5 + 6 * x["x"])


def test_variables_are_shared_across_signatures(zoo):
    data = zoo.bytes("variables")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    scale = {"scale": np.full((2, 3), 2.0, np.float32)}
    for interp in (ref, ours):
        interp.get_signature_runner("accumulate")(x=np.ones((2, 3), np.float32))
    expected = ref.get_signature_runner("read")(**scale)["scaled"]
    actual = ours.get_signature_runner("read")(**scale)["scaled"]
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(actual, np.full((2, 3), 5.0, np.float32))  # (0.5 + 2*1) * 2


def test_control_flow_loop_counts(zoo):
    """The WHILE trip count and both IF branches follow the int input."""
    data = zoo.bytes("control_flow")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    r, o = ref.get_signature_runner(), ours.get_signature_runner()
    x = np.array([[0.5, -1.0, 2.0, 3.0]], np.float32)
    for n in (0, 1, 3, 4, 9):
        n_arr = np.array(n, np.int32)
        assert_close(o(x=x, n=n_arr)["out"], r(x=x, n=n_arr)["out"], rtol=RTOL, atol=ATOL, what=f"n={n}")


def test_output_shapes_follow_a_resize_before_invoke(zoo):
    """LiteRT knows output shapes right after allocate_tensors; so must kiln (no invoke yet)."""
    data = zoo.bytes("dynamic_batch")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    idx = ours.get_input_details()[0]["index"]
    for interp in (ref, ours):
        interp.resize_tensor_input(idx, [6, 8, 8, 3])
        interp.allocate_tensors()
    assert [list(d["shape"]) for d in ours.get_output_details()] == \
        [list(d["shape"]) for d in ref.get_output_details()] == [[6, 5]]


def test_output_shapes_follow_a_resize_after_an_invoke(zoo):
    """The output an invoke left behind is of the old shape; after the resize the details
    (and get_tensor, until the next invoke) follow the new one, as LiteRT's do."""
    data = zoo.bytes("dynamic_batch")
    ref, ours = litert(data), kiln.Interpreter(model_content=data)
    idx = ours.get_input_details()[0]["index"]
    for batch in (1, 6):
        for interp in (ref, ours):
            interp.resize_tensor_input(idx, [batch, 8, 8, 3])
            interp.allocate_tensors()
        assert [list(d["shape"]) for d in ours.get_output_details()] == \
            [list(d["shape"]) for d in ref.get_output_details()] == [[batch, 5]]
        assert ours.get_tensor(ours.get_output_details()[0]["index"]).shape == (batch, 5)
        run_api(ours, sample_inputs(ours.get_input_details(), batch))
