"""The LiteRT delegate, the default Interpreter's first delegate: builtin partitions run on
LiteRT's own kernels — exactly what LiteRT computes — while Python custom ops, overrides,
and what LiteRT refuses run in kiln between partitions, with the tf.lite API unchanged
(resizing, signatures, variable tensors, reset_all_variables)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import kiln
from kiln.delegates import LiteRtDelegate
from kiln.format import read_model, write_model
from kiln.ir import Model
from kiln.schema import DType
from tests.harness import Const, assert_close, single_op_model
from tests.harness import run_api as run
from tests.runtime.zoo import ZOO, sample_inputs

REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}
#: Whatever --kiln-backend the session runs with, these tests are about the LiteRT default.
pytestmark = pytest.mark.usefixtures("litert_default")


def litert_as_installed(model: bytes, **kwargs):
    """LiteRT's interpreter as its users get it (XNNPACK applied)."""
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model, **kwargs)


def steps_of(interp, subgraph: int = 0) -> list:
    events = []
    interp.profiler = events.append
    interp.invoke()
    interp.profiler = None
    return [(e.op_names, e.delegate) for e in events if e.subgraph == subgraph]


def same_bits(actual, expected) -> bool:
    return len(actual) == len(expected) and all(
        a.dtype == e.dtype and a.shape == e.shape and a.tobytes() == e.tobytes() for a, e in zip(actual, expected))


def _custom_negate(resolver):
    def invoke(context, node):
        node.outputs[0].data = -node.inputs[0].data

    resolver.add_custom("Negate", kiln.Registration(invoke=invoke))


def _chain(with_custom: bool) -> bytes:
    """x -> TANH -> (Negate | NEG) -> ADD(x) -> MUL(2): a custom op between builtins."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 3))
    a, b, c, y = (sg.add_tensor(n, DType.FLOAT32, (2, 3)) for n in "abcy")
    two = sg.add_constant("two", np.full((1,), 2.0, np.float32))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("TANH", [x], [a])
    if with_custom:
        sg.add_operator("CUSTOM", [a], [b], custom_code="Negate")
    else:
        sg.add_operator("NEG", [a], [b])
    sg.add_operator("ADD", [b, x], [c])
    sg.add_operator("MUL", [c, two], [y])
    return write_model(model)


# -- whole models -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_models_give_litert_s_bits(zoo, name):
    """Fully claimed, a model computes what LiteRT computes, bit for bit, invoke after invoke."""
    data = zoo.bytes(name)
    ours, ref = kiln.Interpreter(model_content=data), litert_as_installed(data)
    for seed in (0, 1, 2):
        inputs = sample_inputs(ref.get_input_details(), seed)
        assert same_bits(run(ours, inputs), run(ref, inputs)), f"{name} (seed {seed})"
    delegates = {delegate for _, delegate in steps_of(ours)}
    if name == "variables":  # two signatures share the variables: they stay in kiln's store
        assert delegates == {"litert", None}
    else:
        assert delegates == {"litert"}


def test_claims_are_reported(zoo):
    interp = kiln.Interpreter(model_content=zoo.bytes("cnn"))
    interp.allocate_tensors()
    (delegate,) = [d for d in interp._delegates if isinstance(d, LiteRtDelegate)]
    assert [name for _, name, _ in delegate.claimed] == [op["op_name"] for op in interp._get_ops_details()]
    assert not delegate.rejected and len(delegate.kernels) == 1


def test_lstm_state_is_carried_and_reset():
    """Variable tensors (the LSTM's states) carry across invokes in LiteRT and come back to
    kiln; reset_all_variables restarts both."""
    from tests.ops.test_lstm import _uni_lstm

    operands, _ = _uni_lstm(np.random.default_rng(3), batch=2, time=4, peephole=True)
    data = single_op_model("UNIDIRECTIONAL_SEQUENCE_LSTM", operands, options={"fused_activation_function": 4})
    ours, ref = kiln.Interpreter(model_content=data), litert_as_installed(data)
    x = [np.asarray(operands[0])]
    states = [i for i, t in enumerate(read_model(data).main.tensors) if t.is_variable]
    assert len(states) == 2
    for _ in range(2):
        for step in range(3):
            assert same_bits(run(ours, x), run(ref, x)), step
            assert same_bits([ours.get_tensor(i) for i in states], [ref.get_tensor(i) for i in states])
        assert np.abs(ours.get_tensor(states[1])).max() > 0
        ours.reset_all_variables()
        ref.reset_all_variables()
        assert not np.any(ours.get_tensor(states[1]))
    assert steps_of(ours) == [(("UNIDIRECTIONAL_SEQUENCE_LSTM",), "litert")]


def test_a_custom_op_between_partitions():
    data, twin = _chain(with_custom=True), _chain(with_custom=False)
    ours = kiln.Interpreter(model_content=data, custom_op_registerers=[_custom_negate])
    x = [np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)]
    assert same_bits(run(ours, x), run(litert_as_installed(twin), x))
    assert steps_of(ours) == [(("TANH",), "litert"), (("Negate",), None), (("ADD", "MUL"), "litert")]
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    assert delegate.rejected == {(1, "Negate", 1): "custom op 'Negate' runs in kiln"}


def test_a_custom_op_that_changes_lstm_state_in_place():
    """A Python op between two invokes of a LiteRT partition changes its variable in place:
    LiteRT's next invoke starts from the changed state (it is written in every time)."""
    from tests.ops.test_lstm import _uni_lstm

    operands, _ = _uni_lstm(np.random.default_rng(5), batch=1, time=3)
    model = read_model(single_op_model("UNIDIRECTIONAL_SEQUENCE_LSTM", operands,
                                       options={"fused_activation_function": 4}))
    sg = model.main
    lstm = sg.operators[0]
    cell = lstm.inputs[19]
    done = sg.add_tensor("halved", DType.FLOAT32, cell.shape)
    sg.add_operator("CUSTOM", [cell], [done], custom_code="HalveCell", index=0)
    sg.outputs = [*sg.outputs, done]

    def halve(resolver):
        def invoke(context, node):
            node.inputs[0].data *= np.float32(0.5)        # in place, as a C op may do
            node.outputs[0].data = node.inputs[0].data.copy()

        resolver.add_custom("HalveCell", kiln.Registration(invoke=invoke))

    data = write_model(model)
    x = [np.asarray(operands[0])]
    ours = kiln.Interpreter(model_content=data, custom_op_registerers=[halve])
    reference = kiln.Interpreter(model_content=data, custom_op_registerers=[halve], **REF)
    for _ in range(3):
        actual, expected = run(ours, x), run(reference, x)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert [d for _, d in steps_of(ours)] == [None, "litert"]


def test_python_overrides_run_in_kiln(zoo):
    calls = []

    def invoke(context, node):
        calls.append(node.index)
        node.outputs[0].data = node.inputs[0].data + node.inputs[1].data

    resolver = kiln.BuiltinOpResolver()
    resolver.add_builtin("ADD", kiln.Registration(invoke=invoke))
    data = zoo.bytes("mobilenet")
    ours = kiln.Interpreter(model_content=data, op_resolver=resolver)
    inputs = sample_inputs(ours.get_input_details())
    assert_close(run(ours, inputs)[0], run(litert_as_installed(data), inputs)[0], rtol=1e-5, atol=1e-6)
    assert len(calls) == 10
    assert sum(1 for _, d in steps_of(ours) if d is None) == 10


def test_versions_litert_does_not_register_run_on_kiln_s_kernels():
    """BROADCAST_TO version 1 is kiln's (LiteRT registers it from version 2): given back."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 3))
    shape = sg.add_constant("shape", np.array([2, 3], np.int32))
    b, y = sg.add_tensor("b", DType.FLOAT32, (2, 3)), sg.add_tensor("y", DType.FLOAT32, (2, 3))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("BROADCAST_TO", [x, shape], [b], version=1)
    sg.add_operator("EXP", [b], [y])
    ours = kiln.Interpreter(model_content=write_model(model))
    xv = np.array([[0.0, 1.0, -1.0]], np.float32)
    (got,) = run(ours, [xv])
    np.testing.assert_allclose(got, np.exp(np.broadcast_to(xv, (2, 3))), rtol=1e-6)
    assert steps_of(ours)[0] in ((("BROADCAST_TO",), None), (("BROADCAST_TO",), "numpy"))
    assert steps_of(ours)[1] == (("EXP",), "litert")
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    assert delegate.rejected[(0, "BROADCAST_TO", 1)].startswith(
        "LiteRT refused it: Didn't find op for builtin opcode 'BROADCAST_TO' version '1'")


def test_types_litert_cannot_run_are_given_back():
    """float64 RELU: kiln's kernel runs it, LiteRT's refuses it at prepare."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT64, (4,))
    r, c, y = (sg.add_tensor(n, dt, (4,)) for n, dt in (("r", DType.FLOAT64), ("c", DType.FLOAT32),
                                                          ("y", DType.FLOAT32)))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("RELU", [x], [r])
    sg.add_operator("CAST", [r], [c])
    sg.add_operator("EXP", [c], [y])
    ours = kiln.Interpreter(model_content=write_model(model))
    xv = np.array([-1.0, 0.0, 0.5, 2.0])
    (got,) = run(ours, [xv])
    np.testing.assert_allclose(got, np.exp(np.maximum(xv, 0)).astype(np.float32), rtol=1e-6)
    # LiteRT's RELU checks its type when it runs, not when it prepares: the first invoke
    # finds out, and from then on kiln runs the RELU and LiteRT the rest
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    assert delegate.rejected[(0, "RELU", 1)].startswith(
        "LiteRT refused it when run: Only float32, uint8, int8 and int16 are supported currently, got FLOAT64")
    assert [d for _, d in steps_of(ours)] in ([None, "litert"], ["numpy", "litert"])
    assert len(delegate.kernels) == 1 and [n for _, n, _ in delegate.claimed] == ["CAST", "EXP"]
    np.testing.assert_allclose(run(ours, [xv])[0], got)


def test_strings_do_not_cross_into_litert():
    """A STRING tensor between a kiln op and a builtin: the builtin's node stays in kiln."""
    def as_text(resolver):
        def invoke(context, node):
            node.outputs[0].data = np.array([b"%d" % v for v in node.inputs[0].data.ravel()], object)

        resolver.add_custom("AsText", kiln.Registration(invoke=invoke))

    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.INT32, (3,))
    s = sg.add_tensor("s", DType.STRING, (3,))
    i = sg.add_constant("i", np.array([2, 0], np.int32))
    g = sg.add_tensor("g", DType.STRING, (2,))
    sg.inputs, sg.outputs = [x], [g]
    sg.add_operator("CUSTOM", [x], [s], custom_code="AsText")
    sg.add_operator("GATHER", [s, i], [g])
    ours = kiln.Interpreter(model_content=write_model(model), custom_op_registerers=[as_text])
    (got,) = run(ours, [np.array([7, 8, 9], np.int32)])
    assert [bytes(v) for v in got] == [b"9", b"7"]
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    assert delegate.rejected[(1, "GATHER", 1)] == "its input 's' is STRING, which cannot enter LiteRT"


# -- control flow and variables -----------------------------------------------------------------

def test_loops_with_builtin_bodies_run_whole_in_litert(zoo):
    data = zoo.bytes("control_flow")
    ours = kiln.Interpreter(model_content=data)
    inputs = sample_inputs(ours.get_input_details())
    run(ours, inputs)
    assert steps_of(ours) == [(("GREATER", "WHILE", "IF"), "litert")]
    assert len(ours._envs) == 1  # no kiln environment for the bodies: LiteRT runs them


def test_a_custom_op_in_a_loop_body_keeps_the_loop_in_kiln(zoo):
    """The WHILE is not claimed (its body has a Python op); the body's own builtins are."""
    model = read_model(zoo.bytes("control_flow"))
    body = next(sg for sg in model.subgraphs[1:] if any(op.op_type == "SIN" for op in sg.operators))
    sin = next(op for op in body.operators if op.op_type == "SIN")
    sin.op_type, sin.custom_code = "CUSTOM", "PySin"

    def py_sin(resolver):
        def invoke(context, node):
            node.outputs[0].data = np.sin(node.inputs[0].data)

        resolver.add_custom("PySin", kiln.Registration(invoke=invoke))

    ours = kiln.Interpreter(model_content=write_model(model), custom_op_registerers=[py_sin])
    ref = litert_as_installed(zoo.bytes("control_flow"))
    for seed in (0, 1):
        inputs = sample_inputs(ref.get_input_details(), seed)
        for a, e in zip(run(ours, inputs), run(ref, inputs)):
            assert_close(a, e, rtol=1e-5, atol=1e-6)
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    reasons = {name: why for (_, name, _), why in delegate.rejected.items()}
    assert "runs a custom op in kiln" in reasons["WHILE"]
    assert any(d == "litert" for e in ours._envs.values() if e.sg_index > 0 for d in
               (s.delegate for s in e.steps or ()))


def test_resource_variables_shared_by_signatures_stay_in_kiln(zoo):
    data = zoo.bytes("variables")
    ours, ref = kiln.Interpreter(model_content=data), litert_as_installed(data)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(3):
        got = ours.get_signature_runner("accumulate")(x=x)
        want = ref.get_signature_runner("accumulate")(x=x)
        assert same_bits([got[k] for k in sorted(got)], [want[k] for k in sorted(want)])
    got = ours.get_signature_runner("read")(scale=x)["scaled"]
    np.testing.assert_array_equal(got, ref.get_signature_runner("read")(scale=x)["scaled"])


def _counter_model() -> bytes:
    """One entry point whose resource variable counts invokes: y = x + n, n += 1."""
    model = Model()
    sg = model.add_subgraph("main")
    init = model.add_subgraph("init")
    x = sg.add_tensor("x", DType.FLOAT32, (2,))
    sg.inputs = [x]
    handle = sg.add_tensor("handle", DType.RESOURCE, ())
    n, n1, y = sg.add_tensor("n", DType.FLOAT32, (2,)), sg.add_tensor("n1", DType.FLOAT32, (2,)), \
        sg.add_tensor("y", DType.FLOAT32, (2,))
    one = sg.add_constant("one", np.ones(2, np.float32))
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": 1})
    sg.add_operator("VAR_HANDLE", [], [handle], options={"shared_name": "count"})
    sg.add_operator("READ_VARIABLE", [handle], [n])
    sg.add_operator("ADD", [x, n], [y])
    sg.add_operator("ADD", [n, one], [n1])
    sg.add_operator("ASSIGN_VARIABLE", [handle, n1], [])
    sg.outputs = [y]
    h0 = init.add_tensor("h0", DType.RESOURCE, ())
    zero = init.add_constant("zero", np.full(2, 10.0, np.float32))
    init.add_operator("VAR_HANDLE", [], [h0], options={"shared_name": "count"})
    init.add_operator("ASSIGN_VARIABLE", [h0, zero], [])
    return write_model(model)


def test_resource_variables_of_a_whole_model_run_in_litert():
    data = _counter_model()
    ours, reference = kiln.Interpreter(model_content=data), kiln.Interpreter(model_content=data, **REF)
    x = [np.array([1.0, 2.0], np.float32)]
    for k in range(3):
        (got,), (want,) = run(ours, x), run(reference, x)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, [11.0 + k, 12.0 + k])
    assert [d for _, d in steps_of(ours)] == ["litert"]
    (kernel,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)][0].kernels
    assert kernel.hidden_state  # so a resize never runs it to learn shapes


# -- the tf.lite API around partitions ----------------------------------------------------------

def test_resizing_reaches_the_partitions(zoo):
    data = zoo.bytes("dynamic_batch")
    ours, ref = kiln.Interpreter(model_content=data), litert_as_installed(data)
    index = ours.get_input_details()[0]["index"]
    for batch in (1, 4, 1, 7):
        for interp in (ours, ref):
            interp.resize_tensor_input(index, [batch, 8, 8, 3])
            interp.allocate_tensors()
        assert list(ours.get_output_details()[0]["shape"]) == [batch, 5]
        x = sample_inputs(ours.get_input_details(), batch)
        assert same_bits(run(ours, x), run(ref, x))


def test_hidden_intermediates_say_how_to_read_them(zoo):
    data = zoo.bytes("cnn")
    ours = kiln.Interpreter(model_content=data)
    inputs = sample_inputs(ours.get_input_details())
    run(ours, inputs)
    inner = ours._get_ops_details()[1]["outputs"][0]
    with pytest.raises(kiln.InterpreterError, match=r"intermediate of nodes 0\.\.5, which the litert delegate "
                                                    r"runs .* experimental_preserve_all_tensors=True"):
        ours.get_tensor(inner)
    keep = kiln.Interpreter(model_content=data, experimental_preserve_all_tensors=True)
    run(keep, inputs)
    assert keep.get_tensor(inner).shape == tuple(ours.get_tensor_details()[inner]["shape"])
    assert {d for _, d in steps_of(keep)} == {None}


@pytest.mark.parametrize("kind", ["BUILTIN_REF", "BUILTIN_WITHOUT_DEFAULT_DELEGATES"])
def test_reference_resolver_types_never_use_litert(zoo, kind):
    interp = kiln.Interpreter(model_content=zoo.bytes("mlp"),
                              experimental_op_resolver_type=getattr(kiln.OpResolverType, kind))
    run(interp, sample_inputs(interp.get_input_details()))
    assert {d for _, d in steps_of(interp)} == {None}


def test_litert_errors_name_the_partition():
    """An index LiteRT's GATHER refuses at run time: an OpError naming the nodes."""
    model = Model()
    sg = model.add_subgraph("main")
    x, i = sg.add_tensor("x", DType.FLOAT32, (3,)), sg.add_tensor("i", DType.INT32, (2,))
    y = sg.add_tensor("y", DType.FLOAT32, (2,))
    sg.inputs, sg.outputs = [x, i], [y]
    sg.add_operator("GATHER", [x, i], [y])
    ours = kiln.Interpreter(model_content=write_model(model))
    with pytest.raises(kiln.OpError, match=r"nodes 0\.\.0 \(delegated to litert\).*LiteRT failed"):
        run(ours, [np.ones(3, np.float32), np.array([0, 7], np.int32)])


def test_an_xnnpack_failure_falls_back_to_litert_s_builtin_kernels():
    """LiteRT's XNNPACK cannot set up a graph of constants only (LiteRT itself fails there)."""
    w16 = np.random.default_rng(0).normal(0, 1, (4, 6)).astype(np.float16)
    data = single_op_model("DEQUANTIZE", [Const(w16)], out_dtypes=[np.float32], out_shapes=[(4, 6)], version=3)
    with pytest.raises(RuntimeError, match="XNNPACK"):
        run(litert_as_installed(data), [])
    (got,) = run(kiln.Interpreter(model_content=data), [])
    np.testing.assert_array_equal(got, w16.astype(np.float32))


def test_num_threads_reaches_litert(zoo):
    interp = kiln.Interpreter(model_content=zoo.bytes("cnn"), num_threads=2)
    run(interp, sample_inputs(interp.get_input_details()))
    (delegate,) = [d for d in interp._delegates if isinstance(d, LiteRtDelegate)]
    assert delegate.kernels[0].num_threads == 2
    with pytest.raises(ValueError, match="num_threads must be an int >= 1"):
        LiteRtDelegate(num_threads=0)


def test_without_ai_edge_litert_kiln_runs_on_its_own_with_one_hint(zoo, monkeypatch, caplog):
    from kiln.delegates import litert

    monkeypatch.setattr(litert, "litert_available", lambda: False)
    monkeypatch.setattr(litert, "_hinted", False)
    data = zoo.bytes("mlp")
    with caplog.at_level(logging.WARNING, logger="kiln.delegates.litert"):
        interps = [kiln.Interpreter(model_content=data) for _ in range(3)]
    hints = [r for r in caplog.records if "ai-edge-litert is not installed" in r.getMessage()]
    assert len(hints) == 1 and "\n" not in hints[0].getMessage()
    run(interps[0], sample_inputs(interps[0].get_input_details()))
    assert {d for _, d in steps_of(interps[0])} == {"numpy"}
    with pytest.raises(kiln.UnsupportedError, match="needs ai-edge-litert"):
        LiteRtDelegate()


def test_the_runtime_imports_and_runs_without_ai_edge_litert(zoo, tmp_path):
    """In a process where ai_edge_litert cannot be imported at all."""
    import subprocess
    import sys

    path = tmp_path / "mlp.tflite"
    path.write_bytes(zoo.bytes("mlp"))
    code = (
        "import sys; sys.modules['ai_edge_litert'] = None\n"
        "import importlib.util, numpy as np, kiln\n"
        "importlib.util.find_spec = lambda name, *a, _f=importlib.util.find_spec: "
        "None if name == 'ai_edge_litert' else _f(name, *a)\n"
        f"i = kiln.Interpreter(model_path={str(path)!r}); i.allocate_tensors()\n"
        "d = i.get_input_details()[0]; i.set_tensor(d['index'], np.ones(d['shape'], np.float32)); i.invoke()\n"
        "kiln.Interpreter(model_path=%r)\n"
        "print(i.get_tensor(i.get_output_details()[0]['index']).shape)\n" % str(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, 10)"
    assert out.stderr.count("ai-edge-litert is not installed") == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int16x8", "dynamic"])
def test_quantized_models_give_litert_s_bits(mode):
    """Integer, 16x8 and hybrid models (kiln's quantizations of a converter-zoo CNN) run
    whole in LiteRT, so kiln computes exactly what LiteRT does (its optimised kernels, which
    are not its reference ones: tests/quant holds kiln's own kernels to those)."""
    from tests.quant import zoo_models

    model = zoo_models.kiln_quantized("k3_cnn", mode, 3, 8)
    inputs = zoo_models.data("k3_cnn", 3, 8, 3)[1]
    ours, ref = kiln.Interpreter(model_content=model), litert_as_installed(model)
    for x in inputs:
        assert same_bits(zoo_models.invoke(ours, x), zoo_models.invoke(ref, x))
    assert {d for _, d in steps_of(ours)} == {"litert"}


@pytest.mark.parametrize("case", ["plain", "aux_cross_linked"])
def test_batch_major_merged_bidirectional_lstm_is_left_to_kiln(case):
    """LiteRT's BIDIRECTIONAL_SEQUENCE_LSTM steps batch entry b's states by the merged output's
    width when it merges batch-major outputs, so every entry after the first is wrong. The
    delegate leaves such a node to kiln's kernel, whose answer equals LiteRT's on the same
    model written time-major (where LiteRT is right), transposed."""
    from kiln.schema import BIDIRECTIONAL_LSTM_AUX_INPUT, Activation
    from tests.harness import _kernel_outputs
    from tests.ops import test_lstm as lstm_cases
    from tests.quant.test_hybrid_lstm import _run as run_stateful

    def model_of(operands, time_major):
        options = {"fused_activation_function": Activation.TANH, "time_major": time_major, "merge_outputs": True}
        probe = _kernel_outputs("BIDIRECTIONAL_SEQUENCE_LSTM", operands, options, None)
        model = single_op_model("BIDIRECTIONAL_SEQUENCE_LSTM", operands, options=options,
                                out_dtypes=[p.dtype for p in probe], out_shapes=[p.shape for p in probe])
        return model, [np.asarray(x) for x in operands if isinstance(x, np.ndarray)]

    operands, states = lstm_cases._bidi_lstm(np.random.default_rng(3), time_major=False, n_input=5, n_cell=4,
                                             batch=3, time=4, **lstm_cases.BIDI_CASES[case])
    swapped = list(operands)
    for i in (0, BIDIRECTIONAL_LSTM_AUX_INPUT):
        if isinstance(swapped[i], np.ndarray):
            swapped[i] = np.ascontiguousarray(swapped[i].transpose(1, 0, 2))
    delegate = LiteRtDelegate()
    ours = run_stateful(*model_of(operands, False), states,
                        lambda m: kiln.Interpreter(model_content=m, experimental_delegates=[delegate], **REF))
    want = run_stateful(*model_of(swapped, True), states, litert_as_installed)
    for got, exp in zip(ours[:-1], want[:-1]):       # the merged output of each invoke
        assert_close(got[0], exp[0].transpose(1, 0, 2), atol=1e-5)
    assert_close(np.concatenate(ours[-1]), np.concatenate(want[-1]), atol=1e-5)   # the states after
    assert "mixes up the states of batch entries" in delegate.rejected[(0, "BIDIRECTIONAL_SEQUENCE_LSTM", 1)]


@pytest.mark.parametrize("op_type,dtype", [("ADD", np.int8), ("SUB", np.uint8), ("LESS", np.int8),
                                           ("EQUAL", np.uint8), ("MUL", np.int8)])
def test_integers_litert_would_read_as_quantized_run_in_kiln(op_type, dtype):
    """A third-party file with int8 / uint8 operands and no quantization parameters: LiteRT's
    kernels take them as quantized (ADD, SUB and the comparisons abort the process, MUL computes
    with a zero scale), so the delegate leaves the node to kiln's kernel, which computes on the
    integers (wrapping, as TensorFlow does)."""
    a = np.array([1, 2, 100, 7, 120], dtype)
    b = np.array([1, 3, 100, 2, 120], dtype)
    model = single_op_model(op_type, [a, b])
    ours = kiln.Interpreter(model_content=model)
    (got,) = run(ours, [a, b])
    (want,) = run(kiln.Interpreter(model_content=model, **REF), [a, b])
    assert got.dtype == want.dtype and np.array_equal(got, want)
    if op_type in ("ADD", "SUB", "MUL"):
        np.testing.assert_array_equal(got, {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply}[op_type](a, b))
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    (why,) = [r for (_, name, _), r in delegate.rejected.items() if name == op_type]
    assert "no quantization parameters" in why


@pytest.mark.parametrize("op_type,dtype", [("ZEROS_LIKE", np.int8), ("ADD_N", np.int64), ("CUMSUM", np.int8)])
def test_types_litert_does_not_run_are_left_to_kiln(op_type, dtype):
    """A third-party file with a node of an operand type LiteRT does not run (its record's
    `types`; ZEROS_LIKE and ADD_N fail only once invoked): the delegate leaves the node to kiln's
    kernel, so the default Interpreter computes what BUILTIN_REF does instead of failing."""
    a = np.array([1, -2, 7, 3], dtype)
    operands = {"ZEROS_LIKE": [a], "ADD_N": [a, a, a], "CUMSUM": [a, Const(np.array(0, np.int32))]}[op_type]
    model, feeds = single_op_model(op_type, operands), [x for x in operands if isinstance(x, np.ndarray)]
    with pytest.raises(Exception):  # noqa: B017 - LiteRT's own kinds of error
        run(litert_as_installed(model), feeds)
    ours = kiln.Interpreter(model_content=model)
    (got,) = run(ours, feeds)
    (want,) = run(kiln.Interpreter(model_content=model, **REF), feeds)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    (delegate,) = [d for d in ours._delegates if isinstance(d, LiteRtDelegate)]
    (why,) = [r for (_, name, _), r in delegate.rejected.items() if name == op_type]
    assert f"takes no {np.dtype(dtype).name} operands" in why


def _where_then(op_type: str) -> bytes:
    """x > 100 -> WHERE -> (CAST to int32 | GATHER_ND of x): empty when no element passes."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 4))
    hundred = sg.add_constant("hundred", np.array(100.0, np.float32))
    mask = sg.add_tensor("mask", DType.BOOL, (2, 4))
    where = sg.add_tensor("where", DType.INT64, (1, 2), shape_signature=(-1, 2))
    sg.add_operator("GREATER", [x, hundred], [mask])
    sg.add_operator("WHERE", [mask], [where])
    if op_type == "CAST":
        y = sg.add_tensor("y", DType.INT32, (1, 2), shape_signature=(-1, 2))
        sg.add_operator("CAST", [where], [y])
    else:
        y = sg.add_tensor("y", DType.FLOAT32, (1,), shape_signature=(-1,))
        sg.add_operator("GATHER_ND", [x, where], [y])
    sg.inputs, sg.outputs = [x], [where, y]
    return write_model(model)


@pytest.mark.parametrize("op_type", ["CAST", "GATHER_ND"])
@pytest.mark.parametrize("top", [0.0, 150.0])
def test_outputs_sized_to_nothing_are_empty_arrays(op_type, top):
    """WHERE of no true element gives [0, 2] (LiteRT's GetTensor refuses an empty tensor: the
    delegate makes the empty array), and the ops after it see the empty tensor too."""
    x = np.array([[1.0, top, 3.0, -4.0], [5.0, 6.0, top, 8.0]], np.float32)
    model = _where_then(op_type)
    got = run(kiln.Interpreter(model_content=model), [x])
    want = run(kiln.Interpreter(model_content=model, **REF), [x])
    assert [g.shape for g in got] == [w.shape for w in want] == ([(0, 2), (0, 2) if op_type == "CAST" else (0,)]
                                                                   if top == 0.0 else [(2, 2), (2, 2) if op_type == "CAST" else (2,)])
    assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))
