"""IR invariants: use-def links stay consistent through every mutator."""

import numpy as np
import pytest

from kiln.ir import IRError, Model, Operator, Signature, check_invariants
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


# -- the subgraph owns its invariants ------------------------------------------------------------

def _with_signature():
    sg, x, w, y, z, add, relu = _chain()
    sg.model.signatures.append(Signature("serve", sg, {"x": x}, {"z": z}))
    return sg, x, w, y, z, add, relu


def test_replace_all_uses_with_retargets_signature_outputs():
    sg, x, w, y, z, add, relu = _with_signature()
    z2 = sg.add_tensor("z2", DType.FLOAT32, (2, 3))
    sg.add_operator("NEG", [y], [z2])
    z.replace_all_uses_with(z2)
    assert sg.outputs == [z2] and sg.model.signatures[0].outputs == {"z": z2}
    assert sg.model.signatures[0].inputs == {"x": x}
    sg.remove_operator(relu)
    check_invariants(sg.model)


def test_check_invariants_covers_signatures_and_membership():
    sg, x, w, y, z, add, relu = _with_signature()
    check_invariants(sg.model)
    sg.model.signatures[0].outputs["z"] = y  # not a subgraph output
    with pytest.raises(IRError, match="signature 'serve': output 'z' is tensor 'y', not an output"):
        check_invariants(sg.model)
    sg.model.signatures[0].outputs["z"] = z
    other = sg.model.add_subgraph("other")
    stray = other.add_tensor("stray", DType.FLOAT32, (2, 3))
    sg.tensors.append(stray)
    with pytest.raises(IRError, match="tensor 'stray' is listed but belongs to another subgraph"):
        check_invariants(sg.model)
    sg.tensors.pop()
    sg.operators.append(relu)
    with pytest.raises(IRError, match="RELU: operator listed twice"):
        check_invariants(sg.model)


def test_add_operator_refuses_what_belongs_elsewhere_and_changes_nothing():
    sg, x, w, y, z, add, relu = _chain()
    other = sg.model.add_subgraph("other")
    with pytest.raises(IRError, match="RELU to subgraph 'other': it already belongs to another"):
        other.add_operator(relu, [], [])
    with pytest.raises(IRError, match="already belongs to this subgraph"):
        sg.add_operator(relu, [y], [z])
    out = other.add_tensor("out", DType.FLOAT32, (2, 3))
    with pytest.raises(IRError, match="tensor 'x' belongs to subgraph 'main'"):
        other.add_operator("NEG", [x], [out])
    neg = Operator("NEG")
    with pytest.raises(IRError, match="'y' already has a producer"):
        sg.add_operator(neg, [x], [y])
    assert x.users == [(add, 0)] and neg.subgraph is None and neg.inputs == ()
    assert relu.subgraph is sg and sg.operators == [add, relu]
    check_invariants(sg.model)


def test_unique_names_are_reserved_by_the_subgraph():
    sg, *_ = _chain()
    assert sg.unique_name("y") == "y1" and sg.unique_name("y") == "y2"
    assert sg.unique_name("fresh") == "fresh" and sg.unique_name("fresh") == "fresh1"
    assert sg.unique_name("z", "_") == "z_1"
    sg.add_tensor("q", DType.FLOAT32, ())
    assert sg.unique_name("q") == "q1"


def test_rollback_takes_out_what_was_added_since_the_checkpoint():
    sg, x, w, y, z, add, relu = _chain()
    before_ops, before_tensors = list(sg.operators), list(sg.tensors)
    mark = sg.checkpoint()
    t1 = sg.add_tensor(sg.unique_name("y"), DType.FLOAT32, (2, 3))
    t2 = sg.add_tensor(sg.unique_name("y"), DType.FLOAT32, (2, 3))
    sg.add_operator("NEG", [y], [t1], index=0)  # added anywhere, not only at the end
    sg.add_operator("ABS", [t1], [t2])
    assert [op.op_type for op in sg.operators_since(mark)] == ["NEG", "ABS"]
    sg.rollback(mark)
    assert sg.operators == before_ops and sg.tensors == before_tensors
    assert y.users == [(relu, 0)] and t1.subgraph is None and t2.producer is None
    assert sg.unique_name("y") == "y1"  # the names of what was taken out are free again
    check_invariants(sg.model)


def test_rollback_refuses_when_older_parts_use_new_ones():
    sg, x, w, y, z, add, relu = _chain()
    mark = sg.checkpoint()
    y2 = sg.add_tensor("y2", DType.FLOAT32, (2, 3))
    sg.add_operator("NEG", [x], [y2])
    relu.set_input(0, y2)
    with pytest.raises(IRError, match="tensor 'y2', added since the checkpoint, is used by RELU"):
        sg.rollback(mark)
    assert sg.operators[-1].op_type == "NEG"  # nothing changed
    relu.set_input(0, x)
    sg.remove_operator(add)
    with pytest.raises(IRError, match="ADD was removed since the checkpoint"):
        sg.rollback(mark)


def test_move_operators_keeps_the_order_valid():
    sg, x, w, y, z, add, relu = _chain()
    a = sg.add_tensor("a", DType.FLOAT32, (2, 3))
    b = sg.add_tensor("b", DType.FLOAT32, (2, 3))
    neg = sg.add_operator("NEG", [x], [a])
    abs_ = sg.add_operator("ABS", [a], [b])
    sg.move_operators([neg, abs_], before=add)
    assert sg.operators == [neg, abs_, add, relu]
    with pytest.raises(IRError, match="RELU before ADD: it reads 'y', which ADD computes later"):
        sg.move_operators([relu], before=add)
    relu.set_input(0, b)
    tail = sg.add_operator("EXP", [z], [sg.add_tensor("e", DType.FLOAT32, (2, 3))])
    with pytest.raises(IRError, match="ABS before EXP: its output 'b' is read earlier, by RELU"):
        sg.move_operators([neg, abs_], before=tail)
    assert sg.operators == [neg, abs_, add, relu, tail]
    check_invariants(sg.model)
