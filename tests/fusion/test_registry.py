"""The fusion registry, the builder helpers, embedding_lookup and tfl_fusable_op custom ops."""

from __future__ import annotations

import numpy as np
import pytest
from flatbuffers import flexbuffers

from kiln.format import read_model
from kiln.fusion import registry
from kiln.fusion.helpers import FusionBuilder, gate_blocks, implements
from kiln.fusion.registry import CompositeCall, NotFusable, find_fusion, fuse_call, register_fusion
from kiln.ir import Model
from kiln.runtime import Interpreter as KilnInterpreter
from kiln.runtime import MutableOpResolver, Registration
from kiln.schema import DType
from tests.fusion.util import In, check_both, composite_model, invoke, litert, op_names
from tests.harness import Const, assert_close

tf = pytest.importorskip("tensorflow")


# -- registry ----------------------------------------------------------------------------------

def test_lookup_order_and_builtins():
    assert find_fusion("embedding_lookup").__name__ == "fuse_embedding_lookup"
    assert find_fusion("lstm_5e1d").__name__ == "fuse_tf_keras_lstm"
    assert find_fusion("LSTMCellSimple,couple_input_forget_gates").__name__ == "fuse_lstm_cell_simple"
    assert find_fusion("LayerNormalizedLstmCellSimple").__name__ == "fuse_layer_norm_lstm_cell_simple"
    # unknown names: the custom-op fallback, unless the attrs say it is not a custom op
    assert find_fusion("my_op").__name__ == "fuse_tfl_fusable_op"
    assert find_fusion("my_op", {"tfl_fusable_op": True}).__name__ == "fuse_tfl_fusable_op"
    assert find_fusion("my_op", {}) is None


def test_user_fusions_take_precedence():
    def mine(call):
        return []

    def prefix_fn(call):
        return []

    register_fusion("embedding_lookup", mine)
    register_fusion("lstm_custom", prefix=True)(prefix_fn)
    try:
        assert find_fusion("embedding_lookup") is mine
        assert find_fusion("lstm_custom_17") is prefix_fn          # longer prefix wins
        assert find_fusion("lstm_other").__name__ == "fuse_tf_keras_lstm"
    finally:
        registry.unregister_fusion("embedding_lookup")
        registry.unregister_fusion("lstm_custom")
    assert find_fusion("embedding_lookup").__name__ == "fuse_embedding_lookup"


def test_fuse_call_without_fusion_returns_none():
    sg = Model().add_subgraph()
    call = CompositeCall("not_registered", {}, [], [], [], sg)
    assert fuse_call(call) is None


def test_fusion_errors_become_not_fusable_and_roll_back():
    def broken(call):
        b = FusionBuilder(call)
        b.emit("ADD", [call.inputs[0], np.float32(1)], [b.tensor("y", DType.FLOAT32, [2])])
        raise registry.KilnError("the weights are odd")

    register_fusion("broken_fusion", broken)
    try:
        sg = Model().add_subgraph()
        x = sg.add_tensor("x", DType.FLOAT32, (2,))
        call = CompositeCall("broken_fusion", {}, [x], [np.float32], [(2,)], sg, label="blk")
        with pytest.raises(NotFusable, match="^blk: not fused: the weights are odd$"):
            fuse_call(call)
        assert sg.operators == [] and sg.tensors == [x] and x.users == []
    finally:
        registry.unregister_fusion("broken_fusion")


def test_wrong_number_of_results_is_refused():
    register_fusion("short", lambda call: [])
    try:
        sg = Model().add_subgraph()
        call = CompositeCall("short", {}, [], [np.float32], [()], sg, label="s")
        with pytest.raises(NotFusable, match="returned 0 outputs for a function with 1 results"):
            fuse_call(call)
    finally:
        registry.unregister_fusion("short")


# -- helpers -----------------------------------------------------------------------------------

def test_implements_text_is_a_name_attr_list_tensorflow_stores():
    text = implements("my_rnn", units=4, clip=1.5, fast=True, act="tanh")
    fn = tf.function(lambda x: x + 1.0, experimental_implements=text)

    @tf.function
    def outer(x):
        return fn(x)

    lib = outer.get_concrete_function(tf.TensorSpec([2])).graph.as_graph_def().library
    (fdef,) = [f for f in lib.function if "_implements" in f.attr]
    func = fdef.attr["_implements"].func
    assert func.name == "my_rnn"
    assert {k: v.WhichOneof("value") for k, v in func.attr.items()} == \
        {"units": "i", "clip": "f", "fast": "b", "act": "s"}
    assert implements("plain") == "plain"


def test_gate_blocks():
    w = np.arange(24).reshape(2, 12)
    blocks = gate_blocks(w, "ifco", axis=1)
    assert list(blocks) == list("ifco")
    np.testing.assert_array_equal(blocks["c"], w[:, 6:9])
    with pytest.raises(registry.KilnError, match="cannot split axis 1 of size 12 into 5 gates"):
        gate_blocks(w, "ifcox", axis=1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_builder_emits_the_transforms_it_cannot_fold(dynamic):
    """On a run-time value every transform is one LiteRT op with TensorFlow's result."""
    model = Model()
    sg = model.add_subgraph("main")
    x_val = np.random.default_rng(0).standard_normal((3, 4, 6)).astype(np.float32)
    x = sg.add_tensor("x", DType.FLOAT32, x_val.shape,
                      shape_signature=(-1, 4, 6) if dynamic else None)
    sg.inputs = [x]
    b = FusionBuilder(sg, "t")
    parts = b.split(x, 3, axis=2)
    outs = [b.transpose(x, [2, 0, 1]), parts[1], b.reverse(x, 1), b.reshape(x, [-1, 24]),
            b.step(x, -1, 1), b.step(x, 0, 1), b.concat([parts[2], parts[0]], -1),
            b.add(x, np.float32(2)), b.mul(x, x)]
    assert all(o.signature[0] == (-1 if dynamic else 3) for o in outs[1:])
    sg.outputs = outs
    from kiln.format import write_model

    data = write_model(model)
    want = [np.transpose(x_val, [2, 0, 1]), x_val[:, :, 2:4], x_val[:, ::-1], x_val.reshape(-1, 24),
            x_val[:, -1], x_val[:, 0], np.concatenate([x_val[:, :, 4:], x_val[:, :, :2]], -1),
            x_val + 2, x_val * x_val]
    check_both(data, [x_val], want, atol=0, rtol=0)


def test_builder_folds_constants_without_storing_intermediates():
    sg = Model().add_subgraph("main")
    b = FusionBuilder(sg, "w")
    k = np.arange(12, dtype=np.float32).reshape(3, 4)
    gates = b.split_gates(b.transpose(k), "ifco", 0)
    assert all(isinstance(g, np.ndarray) for g in gates.values())
    assert sg.tensors == [] and sg.operators == []
    np.testing.assert_array_equal(gates["o"], k.T[3:4])
    scalar = b.const(np.float32(0.5), "half")
    assert scalar.shape == () and scalar.data.shape == ()


def test_builder_names_are_unique_in_the_subgraph():
    """Two calls with the same label (and the importer's own tensors) never share a name."""
    sg = Model().add_subgraph("main")
    sg.add_tensor("lstm/h", DType.FLOAT32, (2,))
    first, second = FusionBuilder(sg, "lstm"), FusionBuilder(sg, "lstm")
    names = [first.tensor("h", DType.FLOAT32, [2]).name, second.tensor("h", DType.FLOAT32, [2]).name,
             first.tensor("h", DType.FLOAT32, [2]).name, second.const(np.float32(1), "c").name]
    assert names == ["lstm/h_1", "lstm/h_2", "lstm/h_3", "lstm/c"]


# -- embedding_lookup --------------------------------------------------------------------------

@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("ids_shape", [(5,), (2, 3)])
@pytest.mark.parametrize("table_shape", [(10, 4), (10, 2, 3)])
@pytest.mark.parametrize("ids_first", [False, True])
def test_embedding_lookup(ids_dtype, ids_shape, table_shape, ids_first):
    rng = np.random.default_rng(1)
    table = rng.standard_normal(table_shape).astype(np.float32)
    ids = rng.integers(0, table_shape[0], ids_shape).astype(ids_dtype)
    expected = tf.nn.embedding_lookup(table, ids).numpy()
    args = [In(ids, dynamic=(0,)), Const(table)]
    built = composite_model("embedding_lookup", {}, args if ids_first else args[::-1], 1,
                            label="embedding")
    assert op_names(built.model) == ["GATHER"]
    assert built.notes == ["embedding: fused into GATHER"]
    check_both(built.model, built.feeds, [expected], atol=0, rtol=0)


def test_embedding_lookup_needs_integer_ids():
    with pytest.raises(NotFusable, match="emb: not fused: embedding ids must be int32 or int64"):
        composite_model("embedding_lookup", {}, [Const(np.zeros((4, 2), np.float32)),
                                                 In(np.zeros(3, np.float32))], 1, label="emb")


# -- tfl_fusable_op ----------------------------------------------------------------------------

def test_tfl_fusable_op_becomes_a_custom_op_with_flexbuffer_options():
    attrs = {"tfl_fusable_op": True, "alpha": 0.25, "count": 3, "flag": False, "mode": b"fast"}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    built = composite_model("my_company.scaled_sum", attrs, [In(x), Const(np.ones(3, np.float32))],
                            1, out_shapes=[(2, 3)], label="scaled_sum")
    model = read_model(built.model)
    (op,) = model.main.operators
    assert op.op_type == "CUSTOM" and op.custom_code == "my_company.scaled_sum"
    options = flexbuffers.Loads(op.custom_options)
    assert options == {"alpha": 0.25, "count": 3, "flag": False, "mode": "fast"}
    # LiteRT cannot run it without a C++ kernel ...
    with pytest.raises(RuntimeError, match="my_company.scaled_sum"):
        interp = litert(built.model)
        interp.allocate_tensors()
    # ... kiln runs it with a Python one that reads the options by key.
    def prepare(context, node):
        context.resize_tensor(node.outputs[0], node.inputs[0].shape)

    def invoke_(context, node):
        opts = flexbuffers.Loads(node.custom_options)
        node.outputs[0].data = (node.inputs[0].data + node.inputs[1].data) * opts["alpha"]

    resolver = MutableOpResolver()
    resolver.add_custom("my_company.scaled_sum", Registration(prepare=prepare, invoke=invoke_))
    interp = KilnInterpreter(model_content=built.model, op_resolver=resolver)
    (got,) = invoke(interp, [x])
    assert_close(got, (x + 1) * 0.25)


def test_unknown_names_without_the_flag_are_inlined():
    sg = Model().add_subgraph()
    x = sg.add_tensor("x", DType.FLOAT32, (2,))
    call = CompositeCall("my_op", {"other": 1}, [x], [np.float32], [(2,)], sg, label="f")
    assert fuse_call(call) is None  # nothing registered: inline, nothing to explain
    # an importer that looks up by name alone gets the fallback, which says why it declines
    with pytest.raises(NotFusable, match="f: not fused: no fusion is registered for 'my_op'"):
        find_fusion("my_op")(call)


def test_unsupported_attr_types_are_refused():
    with pytest.raises(NotFusable, match="attr 'shape' of type list cannot go into"):
        composite_model("my_op", {"tfl_fusable_op": True, "shape": [1, 2]},
                        [In(np.zeros(2, np.float32))], 1)
