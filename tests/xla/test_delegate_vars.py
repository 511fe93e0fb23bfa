"""Resource variables and CALL_ONCE inside XlaDelegate partitions (kiln/xla/partition_vars.py),
against kiln's reference kernels and LiteRT: the runtime zoo's models with variables fully
claimed across invokes and reset_all_variables, partitions split around a variable (written
in XLA and read by the reference kernels, and the reverse), one variable behind two handles,
variables whose shape or type changes, and the default NumPy delegate unchanged."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln import ops  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln.format import read_model, write_model  # noqa: E402
from kiln.ir import Model, QuantParams  # noqa: E402
from kiln.schema import DType  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from kiln.xla.graph import is_resource_op  # noqa: E402
from kiln.xla.table import lowered_ops  # noqa: E402
from tests.harness import assert_close, feed  # noqa: E402
from tests.runtime.conftest import litert  # noqa: E402
from tests.runtime.zoo import ZOO, cached_model  # noqa: E402

REF = kiln.OpResolverType.BUILTIN_REF


def _reference(data, **kwargs):
    return kiln.Interpreter(model_content=data, experimental_op_resolver_type=REF, **kwargs)


def _xla(data, **kwargs):
    delegate = XlaDelegate(**{k: kwargs.pop(k) for k in ("ops", "dtype_policy") if k in kwargs})
    return kiln.Interpreter(model_content=data, experimental_delegates=[delegate], **kwargs), delegate


def _resource_model_names(zoo) -> list[str]:
    names = [n for n in ZOO if any(is_resource_op(op.op_type) for sg in read_model(zoo.bytes(n)).subgraphs
                                   for op in sg.operators)]
    assert names, "the runtime zoo has no model with resource variables"
    return names


def _signature_feeds(runner, rng) -> dict:
    feeds = {}
    for name, d in runner.get_input_details().items():
        shape = [max(1, int(s)) for s in d["shape"]]
        feeds[name] = rng.standard_normal(shape).astype(d["dtype"])
    return feeds


def _assert_fully_claimed(delegate, interp):
    assert not delegate.rejected, delegate.rejected
    prepared = sum(len(env.sg.operators) for env in interp._envs.values() if env.steps is not None)
    assert len(delegate.claimed) == prepared
    for env in interp._envs.values():
        assert all(step.delegate == "xla" for step in env.steps or ())


def test_zoo_models_with_variables_fully_claimed_across_invokes_and_reset(zoo):
    for name in _resource_model_names(zoo):
        data = zoo.bytes(name)
        ours, delegate = _xla(data)
        ref, lite = _reference(data), litert(data)
        keys = list(lite.get_signature_list())
        rng = np.random.default_rng(5)
        for round_ in range(4):
            if round_ == 3:  # LiteRT keeps resource variables on reset (only variable tensors reset)
                for interp in (ours, ref, lite):
                    interp.reset_all_variables()
            for key in keys:
                feeds = _signature_feeds(lite.get_signature_runner(key), rng)
                expected = lite.get_signature_runner(key)(**feeds)
                reference = ref.get_signature_runner(key)(**feeds)
                actual = ours.get_signature_runner(key)(**feeds)
                for out, want in expected.items():
                    assert_close(actual[out], want, rtol=1e-5, atol=1e-6, what=f"{name}/{key}/{out} round {round_}")
                    assert_close(actual[out], reference[out], rtol=1e-5, atol=1e-6, what=f"{name}/{key}/{out}")
        _assert_fully_claimed(delegate, ours)
        assert all(k.compiles == 1 for k in delegate.kernels), "an unchanged signature compiled again"
        # Variables only the partitions touch stay in device memory between invokes.
        store = ours._runtime.variables
        assert len(store) and all(isinstance(store.held(rid), jax.Array) for rid in store)


def test_zoo_variables_through_invoke_match_the_reference(zoo):
    for name in _resource_model_names(zoo):
        data = zoo.bytes(name)
        ours, delegate = _xla(data)
        ref = _reference(data)
        rng = np.random.default_rng(2)
        for _ in range(3):
            inputs = [rng.standard_normal(d["shape"]).astype(d["dtype"]) for d in ref.get_input_details()]
            for a, e in zip(feed(ours, inputs), feed(ref, inputs)):
                assert_close(a, e, rtol=1e-5, atol=1e-6, what=name)
        _assert_fully_claimed(delegate, ours)


def _build_stateful_lstm() -> bytes:
    """A Keras stateful LSTM (tf_keras, TF's converter): its states are resource variables
    that a CALL_ONCE initialises, read before a WHILE over the steps and assigned after it."""
    from tests.runtime import zoo as runtime_zoo

    tf = runtime_zoo._quiet_tf()
    import tf_keras

    tf_keras.utils.set_random_seed(1)
    inp = tf_keras.Input((5, 3), batch_size=2)
    model = tf_keras.Model(inp, tf_keras.layers.LSTM(4, stateful=True)(inp))
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def test_keras_stateful_lstm_fully_claimed_keeps_its_state():
    data = cached_model("stateful_lstm", _build_stateful_lstm).read_bytes()
    ours, delegate = _xla(data)
    rounds = _run_rounds([ours, _reference(data), litert(data)], n_inputs=(2, 5, 3), rounds=3, seed=9)
    for r, (actual, reference, expected) in enumerate(rounds):
        assert_close(actual, expected, rtol=1e-5, atol=1e-6, what=f"round {r}")
        assert_close(actual, reference, rtol=1e-5, atol=1e-6, what=f"round {r}")
    _assert_fully_claimed(delegate, ours)


# -- models built with kiln's IR -------------------------------------------------------------

def _versions(model: Model) -> bytes:
    for sg in model.subgraphs:
        for op in sg.operators:
            op.version = ops.require(op.op_type).version(op) if op.op_type != "CUSTOM" else 1
    return write_model(model)


def _add_init(model: Model, name: str, value: np.ndarray):
    """An init subgraph assigning ``value`` to variable ``name``; returns its index."""
    init = model.add_subgraph("init")
    h = init.add_tensor("h", DType.RESOURCE, ())
    init.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": name})
    init.add_operator("ASSIGN_VARIABLE", [h, init.add_constant("init_value", value)], [])
    return len(model.subgraphs) - 1


def _accumulator(custom: bool = False) -> bytes:
    """y = 2 * (acc += x), acc initialised to ones by CALL_ONCE; the read goes through a second
    VAR_HANDLE of the same name. With ``custom``, a Python custom op between the write and the
    read splits the partition."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 3))
    sg.inputs.append(x)
    init = _add_init(model, "acc", np.ones((2, 3), np.float32))
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": init})
    h1 = sg.add_tensor("h1", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h1], options={"container": "", "shared_name": "acc"})
    old = sg.add_tensor("old", DType.FLOAT32, (2, 3))
    sg.add_operator("READ_VARIABLE", [h1], [old])
    new = sg.add_tensor("new", DType.FLOAT32, (2, 3))
    sg.add_operator("ADD", [old, x], [new])
    sg.add_operator("ASSIGN_VARIABLE", [h1, new], [])
    h2 = sg.add_tensor("h2", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h2], options={"container": "", "shared_name": "acc"})
    scale = sg.add_constant("two", np.array(2.0, np.float32))
    if custom:
        doubled = sg.add_tensor("doubled", DType.FLOAT32, ())
        sg.add_operator("CUSTOM", [scale], [doubled], custom_code="Same")
        scale = doubled
    cur = sg.add_tensor("cur", DType.FLOAT32, (2, 3))
    sg.add_operator("READ_VARIABLE", [h2], [cur])
    y = sg.add_tensor("y", DType.FLOAT32, (2, 3))
    sg.add_operator("MUL", [cur, scale], [y])
    sg.outputs.append(y)
    return _versions(model)


def _same_op():
    def invoke(context, node):
        node.outputs[0].data[...] = node.inputs[0].data

    def prepare(context, node):
        context.resize_tensor(node.outputs[0], node.inputs[0].shape)

    return kiln.Registration(prepare=prepare, invoke=invoke)


def _run_rounds(interps, n_inputs=(2, 3), rounds=3, seed=0):
    """Invoke every interpreter on the same inputs, ``rounds`` times, then after
    reset_all_variables once more; returns per round [output per interpreter]."""
    rng = np.random.default_rng(seed)
    results = []
    for r in range(rounds + 1):
        if r == rounds:
            for interp in interps:
                interp.reset_all_variables()
        x = rng.standard_normal(n_inputs).astype(np.float32)
        results.append([feed(interp, [x])[0] for interp in interps])
    return results


@pytest.mark.parametrize("left_out", [None, "READ_VARIABLE", "ASSIGN_VARIABLE", "ADD", "MUL", "VAR_HANDLE",
                                      "CALL_ONCE"])
def test_variable_across_split_partitions_matches_reference_and_litert(left_out):
    """Leaving one op to the reference kernels splits the graph: the variable is then written in
    XLA and read by a reference kernel (READ_VARIABLE left out), written by the reference
    kernel and read in XLA (ASSIGN_VARIABLE left out), or carried between two partitions."""
    data = _accumulator()
    keep = None if left_out is None else sorted(set(lowered_ops()) - {left_out})
    ours, delegate = _xla(data, ops=keep)
    rounds = _run_rounds([ours, _reference(data), litert(data)])
    for r, (actual, reference, expected) in enumerate(rounds):
        assert_close(actual, reference, rtol=1e-6, atol=1e-6, what=f"round {r}")
        assert_close(actual, expected, rtol=1e-6, atol=1e-6, what=f"round {r}")
    rejected = {name for (_, name, _) in delegate.rejected}
    assert rejected == (set() if left_out is None else {left_out})
    if left_out in ("READ_VARIABLE", "ADD"):
        assert len([s for s in ours._env(0).steps if s.delegate == "xla"]) >= 2


def test_variable_across_a_custom_op_split():
    data = _accumulator(custom=True)
    resolver = kiln.BuiltinOpResolver()
    resolver.add_custom("Same", _same_op())
    ref_resolver = kiln.BuiltinOpResolver()
    ref_resolver.add_custom("Same", _same_op())
    ours, delegate = _xla(data, op_resolver=resolver)
    ref = _reference(data, op_resolver=ref_resolver)
    for r, (actual, expected) in enumerate(_run_rounds([ours, ref])):
        assert_close(actual, expected, rtol=1e-6, atol=1e-6, what=f"round {r}")
    assert {name for (_, name, _) in delegate.rejected} == {"Same"}
    steps = ours._env(0).steps
    assert [s.delegate for s in steps] == ["xla", None, "xla"]
    # The second partition only reads the variable the first one wrote: it stays a device array.
    assert isinstance(ours._runtime.variables.held(0), jax.Array)


def test_variable_read_outside_sees_the_current_value():
    """A reference READ_VARIABLE after the XLA partition wrote the variable gets its NumPy copy,
    refreshed after every invoke."""
    data = _accumulator()
    ours, _ = _xla(data, ops=sorted(set(lowered_ops()) - {"READ_VARIABLE"}))
    ref = _reference(data)
    for r, (actual, expected) in enumerate(_run_rounds([ours, ref], rounds=4, seed=3)):
        assert_close(actual, expected, rtol=1e-6, atol=1e-6, what=f"round {r}")


def _reshaping_variable(n_init: int, init_dtype=np.float32) -> bytes:
    """y = v + 1, then v = x: each invoke returns the previous input, whose shape (after a
    resize) and type may differ from the init value's."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (n_init,), shape_signature=(-1,))
    sg.inputs.append(x)
    init = _add_init(model, "v", np.arange(n_init).astype(init_dtype))
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": init})
    h = sg.add_tensor("h", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": "v"})
    old = sg.add_tensor("old", DType.FLOAT32, (n_init,), shape_signature=(-1,))
    sg.add_operator("READ_VARIABLE", [h], [old])
    y = sg.add_tensor("y", DType.FLOAT32, (n_init,), shape_signature=(-1,))
    sg.add_operator("ADD", [old, sg.add_constant("one", np.array(1.0, np.float32))], [y])
    sg.add_operator("ASSIGN_VARIABLE", [h, x], [])
    sg.outputs.append(y)
    return _versions(model)


@pytest.mark.parametrize("init_dtype", [np.float32, np.int32])
def test_variable_changing_shape_and_type_follows_the_reference_kernels(init_dtype):
    data = _reshaping_variable(2, init_dtype)
    ours, delegate = _xla(data)
    ref = _reference(data)
    rng = np.random.default_rng(4)
    signatures, held = set(), (2, np.dtype(init_dtype))
    for n in (2, 3, 3, 5, 2):  # a resize reallocates; the variable keeps the last input's shape
        signatures.add((n, held))
        held = (n, np.dtype(np.float32))
        x = rng.standard_normal(n).astype(np.float32)
        actual, expected = feed(ours, [x])[0], feed(ref, [x])[0]
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        assert_close(actual, expected, rtol=1e-6, atol=1e-6, what=f"n={n}")
    assert not delegate.rejected
    # One compile per (input shape, variable shape, variable type) seen.
    assert delegate.kernels[0].compiles == len(signatures)


def test_read_before_any_assign_is_an_error_as_in_the_reference_kernels():
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2,))
    sg.inputs.append(x)
    h = sg.add_tensor("h", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": "never"})
    v = sg.add_tensor("v", DType.FLOAT32, (2,))
    sg.add_operator("READ_VARIABLE", [h], [v])
    y = sg.add_tensor("y", DType.FLOAT32, (2,))
    sg.add_operator("ADD", [v, x], [y])
    sg.outputs.append(y)
    data = _versions(model)
    for interp in (_xla(data)[0], _reference(data)):
        with pytest.raises(KilnError, match="before any ASSIGN_VARIABLE"):
            feed(interp, [np.zeros(2, np.float32)])


def test_call_once_after_a_variable_op_stays_with_the_reference_kernels():
    """The delegate runs inits before its partition: a CALL_ONCE that follows a variable op of
    its subgraph would run out of order, so it is left to the reference kernels."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2,))
    sg.inputs.append(x)
    init = _add_init(model, "v", np.full(2, 7.0, np.float32))
    h = sg.add_tensor("h", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": "v"})
    sg.add_operator("ASSIGN_VARIABLE", [h, x], [])
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": init})
    v = sg.add_tensor("v", DType.FLOAT32, (2,))
    sg.add_operator("READ_VARIABLE", [h], [v])
    sg.outputs.append(v)
    data = _versions(model)
    ours, delegate = _xla(data)
    ref = _reference(data)
    for k in range(2):  # the first invoke reads the init's value, the second the input
        x = np.array([k, -k], np.float32)
        assert_close(feed(ours, [x])[0], feed(ref, [x])[0], what=f"invoke {k}")
    assert [name for (_, name, _) in delegate.rejected] == ["CALL_ONCE"]
    assert "order" in next(iter(delegate.rejected.values()))


def test_int8_variable_moves_its_codes():
    """ASSIGN_VARIABLE version 2 (int8 values): the codes go in and out unchanged, then an int8
    ADD (claimed as well) rescales them, bit-exact with kiln's reference kernels."""
    q = QuantParams(np.array([0.05], np.float32), np.array([3], np.int64))
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.INT8, (4,), quantization=q)
    sg.inputs.append(x)
    init = _add_init(model, "v", np.zeros(4, np.int8))
    model.subgraphs[init].tensors[-1].quantization = q
    sg.add_operator("CALL_ONCE", [], [], options={"init_subgraph_index": init})
    h = sg.add_tensor("h", DType.RESOURCE, ())
    sg.add_operator("VAR_HANDLE", [], [h], options={"container": "", "shared_name": "v"})
    old = sg.add_tensor("old", DType.INT8, (4,), quantization=q)
    sg.add_operator("READ_VARIABLE", [h], [old])
    y = sg.add_tensor("y", DType.INT8, (4,), quantization=QuantParams(np.array([0.1], np.float32),
                                                                      np.array([-2], np.int64)))
    sg.add_operator("ADD", [old, x], [y])
    sg.add_operator("ASSIGN_VARIABLE", [h, x], [])
    sg.outputs.append(y)
    data = _versions(model)
    ours, delegate = _xla(data)
    ref = _reference(data)  # (LiteRT registers no ASSIGN_VARIABLE version 2)
    rng = np.random.default_rng(11)
    for _ in range(3):
        x = rng.integers(-128, 128, 4).astype(np.int8)
        np.testing.assert_array_equal(feed(ours, [x])[0], feed(ref, [x])[0])
    assert not delegate.rejected, delegate.rejected


def test_bfloat16_policy_keeps_variables_in_their_type(zoo):
    data = zoo.bytes("variables")
    ours, _ = _xla(data, dtype_policy="bfloat16")
    ref = _reference(data)
    rng = np.random.default_rng(8)
    for _ in range(3):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        actual = ours.get_signature_runner("accumulate")(x=x)
        expected = ref.get_signature_runner("accumulate")(x=x)
        for out in expected:
            assert_close(actual[out], expected[out], rtol=3e-2, atol=3e-2, what=out)
    assert all(np.dtype(v.dtype) == np.float32 for v in map(ours._runtime.variables.held, ours._runtime.variables))


def test_default_numpy_delegate_is_unaffected(zoo):
    """Without XlaDelegate the default (compiled NumPy) delegate and the reference kernels run
    the variable ops, with NumPy values in the store."""
    for name in _resource_model_names(zoo):
        data = zoo.bytes(name)
        ours, lite = kiln.Interpreter(model_content=data), litert(data)
        rng = np.random.default_rng(6)
        for _ in range(3):
            for key in lite.get_signature_list():
                feeds = _signature_feeds(lite.get_signature_runner(key), rng)
                expected = lite.get_signature_runner(key)(**feeds)
                actual = ours.get_signature_runner(key)(**feeds)
                for out in expected:
                    assert_close(actual[out], expected[out], rtol=1e-5, atol=1e-6, what=f"{name}/{key}/{out}")
        store = ours._runtime.variables
        assert len(store) and all(type(store.held(rid)) is np.ndarray for rid in store)
