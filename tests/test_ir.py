"""IR invariants: use-def links stay consistent through every mutator."""

import numpy as np
import pytest

from kiln.ir import IRError, Model
from kiln.schema import DType


def _chain():
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 3))
    w = sg.add_constant("w", np.ones((3,), np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (2, 3))
    z = sg.add_tensor("z", DType.FLOAT32, (2, 3))
    add = sg.add_operator("ADD", [x, w], [y])
    relu = sg.add_operator("RELU", [y], [z])
    sg.inputs, sg.outputs = [x], [z]
    return sg, x, w, y, z, add, relu


def test_producer_and_users_are_linked():
    sg, x, w, y, z, add, relu = _chain()
    assert y.producer is add and z.producer is relu
    assert x.users == [(add, 0)] and w.users == [(add, 1)] and y.users == [(relu, 0)]
    assert w.is_constant and not x.is_constant


def test_replace_all_uses_with_updates_both_sides_and_outputs():
    sg, x, w, y, z, add, relu = _chain()
    z2 = sg.add_tensor("z2", DType.FLOAT32, (2, 3))
    z.replace_all_uses_with(z2)
    assert sg.outputs == [z2]
    y.replace_all_uses_with(x)
    assert relu.inputs == (x,) and y.users == [] and (relu, 0) in x.users


def test_removing_an_operator_with_users_is_refused():
    sg, x, w, y, z, add, relu = _chain()
    with pytest.raises(IRError, match="still used by RELU"):
        sg.remove_operator(add)
    with pytest.raises(IRError, match="subgraph output"):
        sg.remove_operator(relu)


def test_remove_operator_and_unused_tensors():
    sg, x, w, y, z, add, relu = _chain()
    relu.set_inputs([x])
    sg.remove_operator(add)
    assert y.producer is None and w.users == [] and x.users == [(relu, 0)]
    assert sg.remove_unused_tensors() == 2  # w and y
    assert [t.name for t in sg.tensors] == ["x", "z"]


def test_a_tensor_has_one_producer():
    sg, x, w, y, z, add, relu = _chain()
    with pytest.raises(IRError, match="already has a producer"):
        sg.add_operator("NEG", [x], [y])


def test_topological_order_and_cycle_detection():
    sg, x, w, y, z, add, relu = _chain()
    sg.operators.reverse()
    assert sg.topological_order() == [add, relu]
    add.set_input(0, z)
    with pytest.raises(IRError, match="cycle"):
        sg.topological_order()
