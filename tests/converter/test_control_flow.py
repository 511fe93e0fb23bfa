"""Control flow and state: WHILE / IF subgraphs, Case chains, TensorList lowering, resource
variables (CALL_ONCE initialiser, VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE)."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kiln  # noqa: E402
from kiln.errors import ConversionError  # noqa: E402
from tests.converter import zoo  # noqa: E402


@pytest.fixture(scope="module")
def tf():
    return zoo._tf()


def litert(data):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=data)


def interpreters(data):
    return [("litert", litert(data)), ("kiln", kiln.Interpreter(model_content=data))]


def convert(*fns, **options):
    c = kiln.TFLiteConverter.from_concrete_functions(list(fns))
    for k, v in options.items():
        setattr(c, k, v)
    return c.convert(), c


def ops_of(data, subgraph=None):
    m = kiln.read_model(data)
    if subgraph is not None:
        return [op.name for op in m.subgraphs[subgraph].operators]
    return [op.name for _, _, op in m.operators()]


def test_constant_condition_is_inlined(tf):
    @tf.function(input_signature=[tf.TensorSpec([3], tf.float32, name="x")])
    def f(x):
        return tf.cond(tf.constant(True), lambda: x * 2.0, lambda: x - 1.0)

    data, _ = convert(f.get_concrete_function())
    assert ops_of(data) == ["MUL"]


@pytest.mark.parametrize("k", [-1, 0, 1, 2, 3, 7])
def test_case_chain_picks_the_branch_tf_picks(tf, k):
    @tf.function(input_signature=[tf.TensorSpec([2], tf.float32, name="x"), tf.TensorSpec([], tf.int32, name="k")])
    def f(x, k):
        return tf.switch_case(k, [lambda: x + 1.0, lambda: x * 10.0, lambda: -x, lambda: x * x])

    data, _ = convert(f.get_concrete_function())
    x = np.array([1.5, -2.0], np.float32)
    expected = f(x, k).numpy()
    for name, interp in interpreters(data):
        out = interp.get_signature_runner()(x=x, k=np.array(k, np.int32))["output_0"]
        np.testing.assert_allclose(out, expected, err_msg=name)


def test_dead_loop_counter_is_dropped(tf):
    @tf.function(input_signature=[tf.TensorSpec([], tf.float32, name="x")])
    def f(x):
        return tf.while_loop(lambda i, y: i < 5, lambda i, y: (i + 1, y * 1.5), [0, x])[1]

    data, _ = convert(f.get_concrete_function())
    (while_op,) = [op for _, _, op in kiln.read_model(data).operators() if op.name == "WHILE"]
    assert len(while_op.inputs) == 2  # i and y; the loop counter / max iterations are gone
    for name, interp in interpreters(data):
        np.testing.assert_allclose(interp.get_signature_runner()(x=np.float32(2))["output_0"], 2 * 1.5 ** 5,
                                   rtol=1e-6, err_msg=name)


def test_tensor_array_unstack_read_write(tf):
    @tf.function(input_signature=[tf.TensorSpec([4, 2], tf.float32, name="x")])
    def f(x):
        src = tf.TensorArray(tf.float32, size=4).unstack(x)
        dst = tf.TensorArray(tf.float32, size=4)
        acc = tf.zeros([2])
        for t in tf.range(4):
            acc = acc + src.read(t)
            dst = dst.write(3 - t, acc * tf.cast(dst.size(), tf.float32))
        return dst.stack()

    data, _ = convert(f.get_concrete_function())
    assert "WHILE" in ops_of(data)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    for name, interp in interpreters(data):
        np.testing.assert_allclose(interp.get_signature_runner()(x=x)["output_0"], f(x).numpy(), err_msg=name)


class Counter:
    """A tf.Module whose step signature assigns a variable and whose read signature reads it."""

    @staticmethod
    def build(tf):
        class M(tf.Module):
            def __init__(self):
                self.count = tf.Variable(10.0)
                self.scale = tf.Variable([1.0, 2.0])

            @tf.function(input_signature=[tf.TensorSpec([2], tf.float32, name="inp")])
            def step(self, x):
                self.count.assign_add(tf.reduce_sum(x))
                return {"out": x * self.scale + self.count}

            @tf.function(input_signature=[])
            def read(self):
                return {"count": self.count + 0.0}

        return M()


def test_resource_variables_keep_state(tf):
    m = Counter.build(tf)
    c = kiln.TFLiteConverter.from_concrete_functions(
        [m.step.get_concrete_function(), m.read.get_concrete_function()], m)
    data = c.convert()
    ops = ops_of(data)
    assert {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= set(ops)
    for name, interp in interpreters(data):
        step, read = interp.get_signature_runner("step"), interp.get_signature_runner("read")
        np.testing.assert_allclose(read()["count"], 10.0, err_msg=name)
        np.testing.assert_allclose(step(inp=np.array([1, 2], np.float32))["out"], [14, 17], err_msg=name)
        np.testing.assert_allclose(step(inp=np.array([1, 1], np.float32))["out"], [16, 17], err_msg=name)
        np.testing.assert_allclose(read()["count"], 15.0, err_msg=name)


def test_read_only_variables_become_constants(tf):
    m = Counter.build(tf)
    data, _ = convert(m.read.get_concrete_function())
    assert "VAR_HANDLE" not in ops_of(data)  # read-only from this signature's point of view


def test_resource_variables_can_be_refused(tf):
    m = Counter.build(tf)
    with pytest.raises(ConversionError, match="experimental_enable_resource_variables is False"):
        convert(m.step.get_concrete_function(), experimental_enable_resource_variables=False)


def test_variable_assigned_in_a_loop(tf):
    """TF's converter fails on this one (resource in a while body); kiln keeps the variable."""
    v = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32, name="n")])
    def f(n):
        for _ in tf.range(n):
            v.assign_add(2.0)
        return v.read_value()

    data, _ = convert(f.get_concrete_function())
    for name, interp in interpreters(data):
        run = interp.get_signature_runner()
        np.testing.assert_allclose(run(n=np.array(3, np.int32))["output_0"], 6.0, err_msg=name)
        np.testing.assert_allclose(run(n=np.array(2, np.int32))["output_0"], 10.0, err_msg=name)


def test_if_with_variable_branches(tf):
    w = tf.Variable([3.0, 4.0])

    @tf.function(input_signature=[tf.TensorSpec([2], tf.float32, name="x")])
    def f(x):
        if tf.reduce_sum(x) > 0:
            return x * w
        return x - w

    data, _ = convert(f.get_concrete_function())
    assert "IF" in ops_of(data)
    for x in (np.array([1, 2], np.float32), np.array([-1, -2], np.float32)):
        for name, interp in interpreters(data):
            np.testing.assert_allclose(interp.get_signature_runner()(x=x)["output_0"], f(x).numpy(), err_msg=name)


def test_a_one_element_list_write_is_the_item_at_any_batch():
    """Keras 3's GRU with return_sequences=False keeps its last output in a one-element
    TensorList; with a dynamic batch its write was SHAPE, SHAPE, MAXIMUM, BROADCAST_TO and
    DYNAMIC_UPDATE_SLICE (26 body ops against TF's 21 at batch 1). Now the item replaces
    the list: the same body at any batch, and the values stay right at batch 3."""
    import keras

    def body_ops(batch):
        m = keras.Sequential([keras.Input((7, 5), batch_size=batch), keras.layers.GRU(16)])
        zoo.randomize(m)
        data = kiln.TFLiteConverter.from_keras_model(m).convert()
        model = kiln.read_model(data)
        return m, data, max(len(sg.operators) for sg in model.subgraphs[1:])

    _, _, static = body_ops(1)
    m, data, dynamic = body_ops(None)
    assert dynamic == static == 21
    x = np.random.default_rng(0).normal(size=(3, 7, 5)).astype(np.float32)
    runner = kiln.Interpreter(model_content=data).get_signature_runner()
    (name,) = runner.get_input_details()
    (got,) = runner(**{name: x}).values()
    np.testing.assert_allclose(got, np.asarray(m(x)), rtol=1e-5, atol=1e-6)
