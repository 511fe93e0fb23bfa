"""TensorFlow's TensorList loops under XLA: a write with the loop counter (SLICEs of run-time
extent reassembled by a CONCATENATION) lowers inside lax.while_loop; a loop whose carried
shapes settle after trips known while tracing has them peeled; one whose shapes still change
is handed back to the reference kernel."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln.format import write_model  # noqa: E402
from kiln.ir import Model  # noqa: E402
from kiln.schema import DType  # noqa: E402
from kiln.xla import XlaDelegate, to_jax  # noqa: E402
from tests.harness import feed  # noqa: E402

REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}
ROWS = 4


def _set_item_loop(reader: str = "CONCATENATION") -> bytes:
    """for i in range(4): L[i] = x * (i + 1), as TF's converter writes TensorListSetItem:
    L[:i] (a SLICE of size i), the item, L[i+1:] (a SLICE from i + 1 to the end),
    concatenated back. ``reader``: what reads the first slice (CONCATENATION, or ADD)."""
    model = Model()
    main, cond, body = model.add_subgraph("main"), model.add_subgraph("cond"), model.add_subgraph("body")
    x = main.add_tensor("x", DType.FLOAT32, (1, 2))
    i0 = main.add_constant("i0", np.array(0, np.int32))
    l0 = main.add_constant("l0", np.zeros((ROWS, 2), np.float32))
    outs = [main.add_tensor(n, dt, s) for n, dt, s in (("i_end", DType.INT32, ()), ("list", DType.FLOAT32, (ROWS, 2)),
                                                       ("x_end", DType.FLOAT32, (1, 2)))]
    main.inputs, main.outputs = [x], [outs[1]]
    main.add_operator("WHILE", [i0, l0, x], outs, options={"cond_subgraph_index": 1, "body_subgraph_index": 2})

    ci, cl, cx = (cond.add_tensor(n, dt, s) for n, dt, s in (("i", DType.INT32, ()), ("l", DType.FLOAT32, (ROWS, 2)),
                                                             ("x", DType.FLOAT32, (1, 2))))
    go = cond.add_tensor("go", DType.BOOL, ())
    cond.add_operator("LESS", [ci, cond.add_constant("n", np.array(ROWS, np.int32))], [go])
    cond.inputs, cond.outputs = [ci, cl, cx], [go]

    t = body.add_tensor
    bi, bl, bx = t("i", DType.INT32, ()), t("l", DType.FLOAT32, (ROWS, 2)), t("x", DType.FLOAT32, (1, 2))
    one = body.add_constant("one", np.array(1, np.int32))
    i1, ri, ri1 = t("i1", DType.INT32, ()), t("ri", DType.INT32, (1,)), t("ri1", DType.INT32, (1,))
    size, begin = t("size", DType.INT32, (2,)), t("begin", DType.INT32, (2,))
    head, tail = t("head", DType.FLOAT32, (1, 1), shape_signature=(-1, -1)), \
        t("tail", DType.FLOAT32, (1, 2), shape_signature=(-1, 2))
    scale, item, new = t("scale", DType.FLOAT32, ()), t("item", DType.FLOAT32, (1, 2)), t("new", DType.FLOAT32, (ROWS, 2))
    shape1 = body.add_constant("shape1", np.array([1], np.int32))
    body.add_operator("ADD", [bi, one], [i1])
    body.add_operator("RESHAPE", [bi, shape1], [ri])
    body.add_operator("CONCATENATION", [ri, body.add_constant("to_end", np.array([-1], np.int32))], [size],
                      options={"axis": 0})
    body.add_operator("SLICE", [bl, body.add_constant("zero2", np.zeros(2, np.int32)), size], [head])
    body.add_operator("RESHAPE", [i1, shape1], [ri1])
    body.add_operator("CONCATENATION", [ri1, body.add_constant("zero1", np.zeros(1, np.int32))], [begin],
                      options={"axis": 0})
    body.add_operator("SLICE", [bl, begin, body.add_constant("all", np.full(2, -1, np.int32))], [tail])
    body.add_operator("CAST", [i1], [scale])
    body.add_operator("MUL", [bx, scale], [item])
    if reader == "CONCATENATION":
        body.add_operator("CONCATENATION", [head, item, tail], [new], options={"axis": 0})
    else:  # a run-time slice read by something that cannot reassemble it
        padded = t("padded", DType.FLOAT32, (ROWS, 2))
        body.add_operator("CONCATENATION", [head, item, tail], [padded], options={"axis": 0})
        body.add_operator("ADD", [padded, head], [new])
    body.inputs, body.outputs = [bi, bl, bx], [i1, new, bx]
    for op in (*main.operators, *cond.operators, *body.operators):
        op.version = kiln.ops.require(op.op_type).version(op)
    return write_model(model)


def test_a_tensorlist_write_with_the_loop_counter_lowers_whole():
    data = _set_item_loop()
    x = np.array([[1.5, -2.0]], np.float32)
    delegate = XlaDelegate()
    (got,) = feed(kiln.Interpreter(model_content=data, experimental_delegates=[delegate]), [x])
    (want,) = feed(kiln.Interpreter(model_content=data, **REF), [x])
    np.testing.assert_array_equal(want, x * np.arange(1, ROWS + 1, dtype=np.float32)[:, None])
    np.testing.assert_array_equal(got, want)
    assert [name for _, name, _ in delegate.claimed] == ["WHILE"] and not delegate.rejected
    fn, params = to_jax(data)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(params, x)[0]), want)


def test_a_run_time_slice_read_by_anything_but_a_concatenation_is_not_claimed():
    data = _set_item_loop(reader="ADD")
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    interp.allocate_tensors()
    (reason,) = delegate.rejected.values()
    assert "only a CONCATENATION of static shape reassembles one" in reason


def _doubling_loop(trips_as_input: bool) -> bytes:
    """v = concat(v, v) three times — or n times, n a model input: the file leaves v's length
    dynamic (-1)."""
    model = Model()
    main, cond, body = model.add_subgraph("main"), model.add_subgraph("cond"), model.add_subgraph("body")
    x = main.add_tensor("x", DType.FLOAT32, (2,), shape_signature=(-1,))
    n = main.add_tensor("n", DType.INT32, ()) if trips_as_input else main.add_constant("n", np.array(3, np.int32))
    i0 = main.add_constant("i0", np.array(0, np.int32))
    i_end, n_end = main.add_tensor("i_end", DType.INT32, ()), main.add_tensor("n_end", DType.INT32, ())
    v_end = main.add_tensor("v_end", DType.FLOAT32, (16,), shape_signature=(-1,))
    y = main.add_tensor("y", DType.FLOAT32, (16,), shape_signature=(-1,))
    main.inputs, main.outputs = [x, n] if trips_as_input else [x], [y]
    main.add_operator("WHILE", [i0, n, x], [i_end, n_end, v_end],
                      options={"cond_subgraph_index": 1, "body_subgraph_index": 2})
    main.add_operator("RELU", [v_end], [y])
    ci, cn, cv = (cond.add_tensor("i", DType.INT32, ()), cond.add_tensor("n", DType.INT32, ()),
                  cond.add_tensor("v", DType.FLOAT32, (2,), shape_signature=(-1,)))
    go = cond.add_tensor("go", DType.BOOL, ())
    cond.add_operator("LESS", [ci, cn], [go])
    cond.inputs, cond.outputs = [ci, cn, cv], [go]
    bi, bn = body.add_tensor("i", DType.INT32, ()), body.add_tensor("n", DType.INT32, ())
    bv = body.add_tensor("v", DType.FLOAT32, (2,), shape_signature=(-1,))
    i1, v2 = body.add_tensor("i1", DType.INT32, ()), body.add_tensor("v2", DType.FLOAT32, (4,), shape_signature=(-1,))
    body.add_operator("ADD", [bi, body.add_constant("one", np.array(1, np.int32))], [i1])
    body.add_operator("CONCATENATION", [bv, bv], [v2], options={"axis": 0})
    body.inputs, body.outputs = [bi, bn, bv], [i1, bn, v2]
    for op in (*main.operators, *cond.operators, *body.operators):
        op.version = kiln.ops.require(op.op_type).version(op)
    return write_model(model)


def test_trips_whose_count_is_known_while_tracing_are_peeled_until_the_shapes_settle():
    """Three doublings with a constant trip count: traced inline, all claimed."""
    data = _doubling_loop(trips_as_input=False)
    x = np.array([1.0, -2.0], np.float32)
    delegate = XlaDelegate()
    (got,) = feed(kiln.Interpreter(model_content=data, experimental_delegates=[delegate]), [x])
    np.testing.assert_array_equal(got, np.maximum(np.tile(x, 8), 0))
    assert [name for _, name, _ in delegate.claimed] == ["WHILE", "RELU"] and not delegate.rejected


def test_a_loop_whose_carried_shape_changes_goes_back_to_the_reference_kernel():
    """Claimed (the file says -1, not a change); tracing finds the change and cannot peel it
    (the trip count is an input); the interpreter runs the WHILE on its kernel from then on,
    and the rest stays with XLA."""
    data = _doubling_loop(trips_as_input=True)
    x, n = np.array([1.0, -2.0], np.float32), np.array(3, np.int32)
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    interp.allocate_tensors()
    assert [name for _, name, _ in delegate.claimed] == ["WHILE", "RELU"]
    (got,) = feed(interp, [x, n], allocate=False)
    np.testing.assert_array_equal(got, np.maximum(np.tile(x, 8), 0))
    assert "changes shape [2] -> [4]" in delegate.rejected[(0, "WHILE", 1)]
    events = []
    interp.profiler = events.append
    interp.invoke()
    assert [(e.op_names, e.delegate) for e in events if e.subgraph == 0] == [(("WHILE",), None), (("RELU",), "xla")]
    (again,) = feed(interp, [x * 2, n], allocate=False)
    np.testing.assert_array_equal(again, np.maximum(np.tile(x * 2, 8), 0))


def _tf_rnn_loop(batch_major: bool) -> tuple[bytes, object]:
    """An RNN written as a tf.while_loop reading x[i] (or x[:, i]) with the loop counter,
    converted by TensorFlow's converter (a STRIDED_SLICE with a run-time begin)."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w = tf.constant(rng.normal(size=(3, 4)).astype(np.float32))
    u = tf.constant(rng.normal(size=(4, 4)).astype(np.float32) * 0.5)
    shape = [2, 6, 3] if batch_major else [6, 2, 3]

    @tf.function(input_signature=[tf.TensorSpec(shape, tf.float32)])
    def rnn(x):
        def body(i, h):
            xt = x[:, i, :] if batch_major else x[i]
            return i + 1, tf.tanh(tf.matmul(xt, w) + tf.matmul(h, u))

        return tf.while_loop(lambda i, h: i < 6, body, (tf.constant(0), tf.zeros([2, 4])))[1]

    data = tf.lite.TFLiteConverter.from_concrete_functions([rnn.get_concrete_function()]).convert()
    return data, rnn


@pytest.mark.parametrize("batch_major", [False, True])
def test_a_tensorflow_loop_reading_with_the_loop_counter_lowers(batch_major):
    data, rnn = _tf_rnn_loop(batch_major)
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    x = np.random.default_rng(1).normal(size=interp.get_input_details()[0]["shape"]).astype(np.float32)
    (got,) = feed(interp, [x])
    want = rnn(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [name for _, name, _ in delegate.claimed] == ["WHILE"] and not delegate.rejected
    fn, params = to_jax(data)
    assert {p.shape for p in params.values()} >= {(4, 3), (4, 4)}  # the loop body's weights
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(params, x)[0]), want, rtol=1e-5, atol=1e-6)


def test_a_run_time_strided_slice_of_run_time_length_is_not_claimed():
    """x[b:e] with b and e model inputs: its length is a run-time value."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (6,))
    b, e = sg.add_tensor("b", DType.INT32, (1,)), sg.add_tensor("e", DType.INT32, (1,))
    y = sg.add_tensor("y", DType.FLOAT32, (2,), shape_signature=(-1,))
    sg.inputs, sg.outputs = [x, b, e], [y]
    op = sg.add_operator("STRIDED_SLICE", [x, b, e, sg.add_constant("s", np.ones(1, np.int32))], [y])
    op.version = kiln.ops.require("STRIDED_SLICE").version(op)
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=write_model(model), experimental_delegates=[delegate])
    (got,) = feed(interp, [np.arange(6, dtype=np.float32), np.array([1], np.int32), np.array([4], np.int32)])
    np.testing.assert_array_equal(got, [1, 2, 3])
    (reason,) = delegate.rejected.values()
    assert "axis 0 is neither shrunk, taken whole nor of constant length" in reason
