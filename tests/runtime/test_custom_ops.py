"""Python custom ops: the guide's Sin example, FlexBuffer attributes, builtin overrides,
version ranges, and the init / free / prepare / invoke contract."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from flatbuffers import flexbuffers

import kiln
from kiln.format import read_model, write_model
from kiln.ir import Model
from kiln.schema import Activation, DType
from tests.harness import feed
from tests.runtime.conftest import litert
from tests.runtime.zoo import cached_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_sin.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("custom_sin_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


custom_sin = _load_example()


def _build_sin() -> bytes:
    return custom_sin.convert_sin_model()


def _build_atan() -> bytes:
    """The current guide's variant: y = atan(x + offset), float32, a custom op "Atan"."""
    import tensorflow as tf

    offset = tf.Variable(0.75)

    @tf.function(input_signature=[tf.TensorSpec([5], tf.float32)])
    def atan(x):
        return tf.atan(x + offset, name="Atan")

    conv = tf.lite.TFLiteConverter.from_concrete_functions([atan.get_concrete_function()], atan)
    conv.allow_custom_ops = True
    return conv.convert()


@pytest.fixture(scope="module")
def sin_model() -> bytes:
    return cached_model("custom_sin", _build_sin).read_bytes()


@pytest.fixture(scope="module")
def atan_model() -> bytes:
    return cached_model("custom_atan", _build_atan).read_bytes()


def run(interp, *inputs):
    return feed(interp, inputs)


# -- the Sin example -------------------------------------------------------------------------

def test_tensorflow_emits_a_custom_sin(sin_model):
    (op,) = read_model(sin_model).main.operators
    assert (op.op_type, op.custom_code, op.version) == ("CUSTOM", "Sin", 1)
    assert flexbuffers.Loads(op.custom_options) == {"T": int(DType.FLOAT64)}


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_sin_example_matches_tf_sin(sin_model, n):
    import tensorflow as tf

    x = np.random.default_rng(n).uniform(-10, 10, n)
    (y,) = run(custom_sin.make_interpreter(sin_model), x)
    np.testing.assert_allclose(y, tf.sin(x).numpy(), rtol=1e-15, atol=1e-15)
    assert y.dtype == np.float64 and y.shape == (n,)


def test_sin_example_script(capsys):
    custom_sin.main()
    out = capsys.readouterr().out
    assert "operators in the converted model: [('Sin', 1)]" in out
    assert "Didn't find custom operator for name 'Sin' ... Registration failed." in out
    assert "max |difference|: 0.0" in out


def test_unresolved_custom_op(sin_model):
    interp = kiln.Interpreter(model_content=sin_model)
    with pytest.raises(kiln.RegistrationError) as info:
        interp.allocate_tensors()
    message = str(info.value)
    assert message.startswith("Didn't find custom operator for name 'Sin'")
    assert "Encountered unresolved custom op: Sin." in message
    assert "Node number 0 (Sin) failed to prepare." in message
    assert message.endswith("Registration failed.")
    # The anchor: LiteRT from Python cannot run the model at all.
    ref = litert(sin_model)
    with pytest.raises(RuntimeError, match="Encountered unresolved custom op: Sin"):
        ref.allocate_tensors()


def test_custom_op_registerers(sin_model):
    """LiteRT's Interpreter(custom_op_registerers=...) — in kiln, Python callables."""
    interp = kiln.Interpreter(model_content=sin_model,
                              custom_op_registerers=[lambda resolver: resolver.add_custom("Sin", custom_sin.SIN)])
    (y,) = run(interp, np.array([0.5, 1.0]))
    np.testing.assert_array_equal(y, np.sin([0.5, 1.0]))
    with pytest.raises(kiln.InterpreterError, match="is not callable"):
        kiln.Interpreter(model_content=sin_model, custom_op_registerers=["TF_AtanRegisterer"])


def test_guide_atan_with_builtin_add(atan_model):
    """Builtins and a Python custom op in one graph (ADD feeds the custom Atan)."""
    model = read_model(atan_model)
    assert [op.name for op in model.main.operators] == ["ADD", "Atan"]

    def atan_invoke(context, node):
        node.outputs[0].data = np.arctan(node.inputs[0].data)

    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("Atan", kiln.Registration(invoke=atan_invoke))
    x = np.array([-8, 0.5, 2, 2.2, 201], np.float32)
    (y,) = run(kiln.Interpreter(model_content=atan_model, op_resolver=resolver), x)
    np.testing.assert_allclose(y, np.arctan(x + np.float32(0.75)), rtol=1e-6)


# -- custom ops built with kiln's IR ---------------------------------------------------------

def custom_model(code: str, attrs: dict | None, out_shape=(1,), version: int = 1, in_shape=(4,),
                 dtype=DType.FLOAT32) -> bytes:
    """x -> CUSTOM(code, FlexBuffer attrs) -> y -> ADD(y, y) -> z (a builtin after the custom op)."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", dtype, in_shape)
    y = sg.add_tensor("y", dtype, out_shape)
    z = sg.add_tensor("z", dtype, out_shape)
    sg.inputs, sg.outputs = [x], [z]
    options = bytes(flexbuffers.Dumps(attrs)) if attrs is not None else None
    sg.add_operator("CUSTOM", [x], [y], custom_code=code, custom_options=options, version=version)
    sg.add_operator("ADD", [y, y], [z])
    return write_model(model)


class ScaleShift:
    """A custom op configured by FlexBuffer attributes: y = x * scale + shift, optionally clipped."""

    def __init__(self):
        self.calls = {"init": 0, "free": 0, "prepare": 0, "invoke": 0}
        self.freed = []

    def init(self, context, buffer):
        self.calls["init"] += 1
        attrs = flexbuffers.Loads(buffer)
        return {"scale": float(attrs["scale"]), "shift": float(attrs.get("shift", 0.0)),
                "clip": tuple(attrs["clip"]) if "clip" in attrs else None, "mode": attrs.get("mode", "")}

    def free(self, context, user_data):
        self.calls["free"] += 1
        self.freed.append(user_data)

    def prepare(self, context, node):
        self.calls["prepare"] += 1
        context.resize_tensor(node.outputs[0], node.inputs[0].shape)

    def invoke(self, context, node):
        self.calls["invoke"] += 1
        cfg = node.user_data
        y = node.inputs[0].data * cfg["scale"] + cfg["shift"]
        if cfg["clip"] is not None:
            y = np.clip(y, *cfg["clip"])
        node.outputs[0].data[...] = y

    def registration(self):
        return kiln.Registration(init=self.init, free=self.free, prepare=self.prepare, invoke=self.invoke)


@pytest.mark.parametrize("attrs, expect", [
    ({"scale": 2.5, "shift": -1.0}, lambda x: x * 2.5 - 1.0),
    ({"scale": -1, "clip": [-0.5, 0.25], "mode": "fast"}, lambda x: np.clip(-x, -0.5, 0.25)),
    ({"scale": 0.5}, lambda x: x * 0.5),
])
def test_flexbuffer_attributes(attrs, expect):
    op = ScaleShift()
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("ScaleShift", op.registration())
    data = custom_model("ScaleShift", attrs)
    x = np.array([-2.0, -0.1, 0.3, 4.0], np.float32)
    (z,) = run(kiln.Interpreter(model_content=data, op_resolver=resolver), x)
    np.testing.assert_allclose(z, 2 * expect(x).astype(np.float32), rtol=1e-6)
    # The attributes survive kiln's own round trip byte for byte.
    (cop, _) = read_model(write_model(read_model(data))).main.operators
    assert flexbuffers.Loads(cop.custom_options) == attrs


def test_init_free_prepare_invoke_lifecycle():
    op = ScaleShift()
    resolver = kiln.MutableOpResolver()
    resolver.add_custom("ScaleShift", op.registration())
    resolver.add_builtin("ADD", kiln.BuiltinOpResolver().find_op("ADD"), 1, 4)
    interp = kiln.Interpreter(model_content=custom_model("ScaleShift", {"scale": 3.0}), op_resolver=resolver)
    assert op.calls == {"init": 0, "free": 0, "prepare": 0, "invoke": 0}
    interp.allocate_tensors()
    assert op.calls["init"] == 1
    x = np.ones(4, np.float32)
    for _ in range(3):
        run(interp, x)
    assert op.calls["prepare"] == 1 and op.calls["invoke"] == 3  # prepare only when shapes change
    run(interp, np.ones(6, np.float32))
    assert op.calls["prepare"] == 2 and op.calls["invoke"] == 4
    assert op.calls["free"] == 0
    del interp
    gc.collect()
    assert op.calls["free"] == 1
    assert op.freed == [{"scale": 3.0, "shift": 0.0, "clip": None, "mode": ""}]


def test_prepare_resizes_outputs():
    """The file says y is [1]; prepare gives it the [n, n] outer product's shape."""

    def prepare(context, node):
        (n,) = node.inputs[0].shape
        context.resize_tensor(node.outputs[0], (n, n))

    def invoke(context, node):
        x = node.inputs[0].data
        assert node.outputs[0].data.shape == (x.size, x.size)  # the buffer prepare sized
        node.outputs[0].data[...] = np.outer(x, x)

    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("Outer", kiln.Registration(prepare=prepare, invoke=invoke))
    interp = kiln.Interpreter(model_content=custom_model("Outer", None, out_shape=(1,)), op_resolver=resolver)
    for n in (4, 2, 5):
        x = np.arange(n, dtype=np.float32)
        (z,) = run(interp, x)
        np.testing.assert_array_equal(z, 2 * np.outer(x, x))
        assert list(interp.get_output_details()[0]["shape"]) == [n, n]


def test_add_builtin_overrides_a_builtin():
    """A Python registration replaces the builtin ADD for versions 1..1; it sees the options."""
    seen = []

    def invoke(context, node):
        act = node.builtin_options.fused_activation_function
        seen.append(act)
        y = node.inputs[0].data + node.inputs[1].data
        node.outputs[0].data = np.maximum(y, 0) if act == Activation.RELU else y

    model = Model()
    sg = model.add_subgraph("main")
    a, b = sg.add_tensor("a", DType.FLOAT32, (3,)), sg.add_tensor("b", DType.FLOAT32, (3,))
    y = sg.add_tensor("y", DType.FLOAT32, (3,))
    sg.inputs, sg.outputs = [a, b], [y]
    sg.add_operator("ADD", [a, b], [y], options={"fused_activation_function": Activation.RELU})
    data = write_model(model)

    resolver = kiln.BuiltinOpResolver()
    resolver.add_builtin("ADD", kiln.Registration(invoke=invoke))
    x1, x2 = np.array([1, -5, 2], np.float32), np.array([1, 1, -9], np.float32)
    (out,) = run(kiln.Interpreter(model_content=data, op_resolver=resolver), x1, x2)
    np.testing.assert_array_equal(out, [2, 0, 0])
    assert seen == [Activation.RELU]
    # A model asking for ADD version 2 is not covered by the override: the builtin kernel runs.
    m = read_model(data)
    m.main.operators[0].version = 2
    (out2,) = run(kiln.Interpreter(model_content=write_model(m), op_resolver=resolver), x1, x2)
    np.testing.assert_array_equal(out2, [2, 0, 0])
    assert seen == [Activation.RELU]


def test_builtin_version_outside_the_registered_range():
    model = read_model(custom_model("ScaleShift", {"scale": 1.0}))
    model.main.operators[1].version = 99  # ADD v99
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("ScaleShift", ScaleShift().registration())
    with pytest.raises(kiln.RegistrationError) as info:
        kiln.Interpreter(model_content=write_model(model), op_resolver=resolver).allocate_tensors()
    message = str(info.value)
    assert "Didn't find op for builtin opcode 'ADD' version '99'" in message
    lo, hi = resolver.registered_versions("ADD")[0]
    assert f"kiln supports ADD versions: {lo}..{hi}" in message
    assert message.endswith("Registration failed.")


def test_custom_version_outside_the_registered_range():
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("ScaleShift", ScaleShift().registration(), min_version=1, max_version=2)
    ok = kiln.Interpreter(model_content=custom_model("ScaleShift", {"scale": 1.0}, version=2), op_resolver=resolver)
    ok.allocate_tensors()
    interp = kiln.Interpreter(model_content=custom_model("ScaleShift", {"scale": 1.0}, version=3),
                              op_resolver=resolver)
    with pytest.raises(kiln.RegistrationError,
                       match=r"Didn't find custom operator for name 'ScaleShift' version '3' "
                             r"\(node 0; registered versions: 1\.\.2\)"):
        interp.allocate_tensors()


def test_resolver_without_builtins_names_the_missing_op():
    resolver = kiln.MutableOpResolver()
    resolver.add_custom("ScaleShift", ScaleShift().registration())
    interp = kiln.Interpreter(model_content=custom_model("ScaleShift", {"scale": 1.0}), op_resolver=resolver)
    with pytest.raises(kiln.RegistrationError, match=r"builtin opcode 'ADD' version '1'.*versions: none"):
        interp.allocate_tensors()


def test_errors_in_python_kernels_name_the_node():
    def invoke(context, node):
        context.report_error("Boom: unsupported input")

    def bad_invoke(context, node):
        raise ZeroDivisionError("division by zero")

    for reg, pattern in ((kiln.Registration(invoke=invoke), r"node 0 \(Boom\).*Boom: unsupported input"),
                         (kiln.Registration(invoke=bad_invoke), r"node 0 \(Boom\).*ZeroDivisionError")):
        resolver = kiln.BuiltinOpResolver()
        resolver.add_custom("Boom", reg)
        interp = kiln.Interpreter(model_content=custom_model("Boom", None), op_resolver=resolver)
        with pytest.raises(kiln.OpError, match=pattern):
            run(interp, np.ones(4, np.float32))


def test_prepare_rejects_wrong_types(sin_model):
    """The Sin kernel's prepare refuses a float32 model ("T" says FLOAT64)."""
    model = read_model(sin_model)
    for t in model.main.tensors:
        t.dtype = DType.FLOAT32
    interp = custom_sin.make_interpreter(write_model(model))
    with pytest.raises(kiln.OpError, match=r"node 0 \(Sin\).*Sin: expected float64 tensors"):
        run(interp, np.ones(3, np.float32))
