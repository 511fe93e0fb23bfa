"""The NumPy delegate, kiln's default delegate, on float models: bit for bit the reference kernels' outputs
(and so LiteRT's within tolerance), the claims the versioning guide asks for, and applied by
default after the user's own delegates unless the op resolver type says otherwise."""

from __future__ import annotations


import numpy as np
import pytest

import kiln
from kiln.delegates import LOWERINGS, LiteRtDelegate, NumpyDelegate
from kiln.format import write_model
from kiln.ir import Model
from kiln.schema import Activation, DType, Padding
from tests.harness import assert_close
from tests.runtime.conftest import litert
from tests.runtime.zoo import ZOO, sample_inputs

RTOL, ATOL = 1e-5, 1e-7
#: The user's delegates only: no default delegate (to look at one delegate's claims alone).
NO_DEFAULT = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
REF = {"experimental_op_resolver_type": kiln.OpResolverType.BUILTIN_REF}
E2E_RTOL = {"mobilenet": 1e-4}  # accumulated float32 rounding over 52 convolutions (see test_zoo)


def run(interp, inputs):
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def steps_of(interp) -> list:
    """The plan steps one invoke of subgraph 0 executes, as profiler events."""
    events = []
    interp.profiler = events.append
    interp.invoke()
    interp.profiler = None
    return [e for e in events if e.subgraph == 0]


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_outputs_match_litert_with_the_delegate(zoo, name):
    data = zoo.bytes(name)
    ref = litert(data)
    ours = kiln.Interpreter(model_content=data, experimental_delegates=[NumpyDelegate()])
    for seed in (0, 1, 2):  # repeated invokes reuse the compiled plan and its buffers
        inputs = sample_inputs(ref.get_input_details(), seed)
        expected, actual = run(ref, inputs), run(ours, inputs)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol=E2E_RTOL.get(name, RTOL), atol=ATOL, what=f"{name} output {k} (seed {seed})")


@pytest.mark.parametrize("name", ["mobilenet", "cnn", "mlp", "dynamic_batch"])
def test_float_convnets_become_one_partition(zoo, name):
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=zoo.bytes(name), experimental_delegates=[delegate])
    run(interp, sample_inputs(interp.get_input_details()))
    n_ops = len(interp._get_ops_details())
    assert len(delegate.claimed) == n_ops and not delegate.rejected
    (step,) = steps_of(interp)
    assert step.delegate == "numpy" and len(step.op_names) == n_ops


def test_unsupported_ops_stay_with_the_interpreter(zoo):
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=zoo.bytes("control_flow"), experimental_delegates=[delegate], **NO_DEFAULT)
    run(interp, sample_inputs(interp.get_input_details()))
    reasons = {name: why for (_, name, _), why in delegate.rejected.items()}
    assert reasons["WHILE"] == "WHILE is not an op this delegate runs"
    assert [(s.op_names, s.delegate) for s in steps_of(interp)] == [
        (("GREATER",), None), (("WHILE",), None), (("IF",), None)]


def test_sequence_lstms_are_claimed_and_their_state_written_back(zoo):
    """The LSTM runs in the chain; its final states leave the partition as state_inputs."""
    data = zoo.bytes("lstm")
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate], **NO_DEFAULT)
    reference = kiln.Interpreter(model_content=data, **REF)
    variables = [d["index"] for d in interp.get_tensor_details() if interp.model.subgraphs[0].tensors[d["index"]].is_variable]
    assert variables
    for seed in (0, 1):
        inputs = sample_inputs(interp.get_input_details(), seed)
        assert _same_bits(run(interp, inputs), run(reference, inputs))
        assert _same_bits([interp.get_tensor(i) for i in variables], [reference.get_tensor(i) for i in variables])
    assert {name for _, name, _ in delegate.claimed} >= {"UNIDIRECTIONAL_SEQUENCE_LSTM", "STRIDED_SLICE"}
    (kernel,) = delegate.kernels
    assert len(kernel.partition.state_inputs) == len(variables)
    interp.reset_all_variables()
    reference.reset_all_variables()
    inputs = sample_inputs(interp.get_input_details(), 0)
    assert _same_bits(run(interp, inputs), run(reference, inputs))


def test_op_subset_splits_partitions(zoo):
    delegate = NumpyDelegate(ops={"CONV_2D", "FULLY_CONNECTED"})
    data = zoo.bytes("cnn")
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate], **NO_DEFAULT)
    x = sample_inputs(interp.get_input_details())
    (actual,) = run(interp, x)
    steps = steps_of(interp)
    assert [(s.op_names, s.delegate) for s in steps] == [
        (("CONV_2D",), "numpy"), (("MAX_POOL_2D",), None), (("CONV_2D",), "numpy"),
        (("AVERAGE_POOL_2D",), None), (("RESHAPE",), None), (("FULLY_CONNECTED",), "numpy")]
    (expected,) = run(litert(data), x)
    assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def _fc_model(version: int, dtype=DType.FLOAT32) -> bytes:
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", dtype, (2, 3))
    w = sg.add_constant("w", np.arange(12).reshape(4, 3).astype(dtype.numpy))
    y = sg.add_tensor("y", dtype, (2, 4))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("FULLY_CONNECTED", [x, w, None], [y], version=version)
    return write_model(model)


@pytest.mark.parametrize("version, claimed", [(1, True), (5, True), (6, True), (2, False), (7, False), (12, False)])
def test_claims_only_known_versions(version, claimed):
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=_fc_model(version), experimental_delegates=[delegate])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run(interp, [x])
    np.testing.assert_allclose(y, x @ np.arange(12, dtype=np.float32).reshape(4, 3).T)  # runs either way
    assert bool(delegate.claimed) == claimed
    if not claimed:
        assert delegate.rejected == {
            (0, "FULLY_CONNECTED", version):
                f"FULLY_CONNECTED version {version} is unknown to the delegate (knows [1, 5, 6])"}


def test_rejects_non_float_tensors():
    delegate = NumpyDelegate()
    model = Model()
    sg = model.add_subgraph("main")
    a, b = sg.add_tensor("a", DType.INT32, (3,)), sg.add_tensor("b", DType.INT32, (3,))
    y = sg.add_tensor("y", DType.INT32, (3,))
    sg.inputs, sg.outputs = [a, b], [y]
    sg.add_operator("ADD", [a, b], [y])
    interp = kiln.Interpreter(model_content=write_model(model), experimental_delegates=[delegate])
    interp.allocate_tensors()
    assert not delegate.claimed
    assert delegate.rejected[(0, "ADD", 1)] == "ADD operand 0 ('a') is INT32, not plain float32"


def test_python_overrides_are_not_claimed(zoo):
    """A builtin replaced through add_builtin keeps running the user's Python kernel."""
    calls = []

    def invoke(context, node):
        calls.append(node.index)
        node.outputs[0].data = node.inputs[0].data + node.inputs[1].data

    resolver = kiln.BuiltinOpResolver()
    resolver.add_builtin("ADD", kiln.Registration(invoke=invoke))
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=zoo.bytes("mobilenet"), op_resolver=resolver,
                              experimental_delegates=[delegate])
    run(interp, sample_inputs(interp.get_input_details()))
    assert len(calls) == 10
    assert {name for (_, name, _) in delegate.rejected} == {"ADD"}
    assert set(delegate.rejected.values()) == {"ADD is overridden by a Python registration"}


def test_unknown_op_names_are_refused():
    with pytest.raises(kiln.UnsupportedError, match=r"no lowering for \['WHILE'\]"):
        NumpyDelegate(ops={"CONV_2D", "WHILE"})
    assert "CONV_2D" in LOWERINGS


def test_dynamic_batch_recompiles_per_shape(zoo):
    data = zoo.bytes("dynamic_batch")
    ref = litert(data)
    delegate = NumpyDelegate()
    ours = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    idx = ours.get_input_details()[0]["index"]
    for batch in (1, 4, 1, 9):
        for interp in (ref, ours):
            interp.resize_tensor_input(idx, [batch, 8, 8, 3])
        x = sample_inputs(ours.get_input_details(), batch)
        (e,), (a,) = run(ref, x), run(ours, x)
        assert a.shape == (batch, 5)
        assert_close(a, e, rtol=RTOL, atol=ATOL, what=f"batch {batch}")
    (kernel,) = delegate.kernels
    assert len(kernel.plans) == 3  # batch 1, 4, 9: the second batch-1 run reused its plan


def test_outputs_are_fresh_arrays(zoo):
    """Values leaving a partition are never overwritten by a later invoke."""
    interp = kiln.Interpreter(model_content=zoo.bytes("cnn"), experimental_delegates=[NumpyDelegate()])
    (d,) = interp.get_input_details()
    out = interp.get_output_details()[0]["index"]
    run(interp, sample_inputs([d], 0))
    first_view = interp.tensor(out)()
    first = first_view.copy()
    run(interp, sample_inputs([d], 1))
    np.testing.assert_array_equal(first_view, first)
    assert not np.array_equal(interp.get_tensor(out), first)


def test_compile_errors_name_the_node():
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 5, 5, 2))
    w = sg.add_constant("w", np.ones((3, 3, 3, 2), np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 3, 3, 3))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("CONV_2D", [x, w, None], [y], options={"padding": Padding.VALID, "stride_h": 1, "stride_w": 1,
                                                            "fused_activation_function": Activation.RELU6})
    interp = kiln.Interpreter(model_content=write_model(model), experimental_delegates=[NumpyDelegate()])
    (y1,) = run(interp, [np.ones((1, 5, 5, 2), np.float32)])
    np.testing.assert_array_equal(y1, np.full((1, 3, 3, 3), 6.0, np.float32))  # 18 clamped by RELU6
    interp.resize_tensor_input(0, [1, 2, 2, 2])  # VALID 3x3 on 2x2: an empty output, as the reference
    (empty,) = run(interp, [np.ones((1, 2, 2, 2), np.float32)])
    assert empty.shape == (1, 0, 0, 3)
    interp.resize_tensor_input(0, [1, 1, 1, 2])
    with pytest.raises(kiln.OpError, match=r"numpy delegate, node 0 \(CONV_2D\): window 3 .* does not fit"):
        run(interp, [np.ones((1, 1, 1, 2), np.float32)])


@pytest.mark.parametrize("padding", [Padding.SAME, Padding.VALID])
@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_and_conv_geometry_match_litert(padding, stride, dilation, mult):
    rng = np.random.default_rng(stride * 10 + dilation)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 13, 11, 3))
    dw = sg.add_constant("dw", rng.standard_normal((1, 3, 3, 3 * mult)).astype(np.float32))
    db = sg.add_constant("db", rng.standard_normal(3 * mult).astype(np.float32))
    cw = sg.add_constant("cw", rng.standard_normal((4, 2, 3, 3 * mult)).astype(np.float32))
    cb = sg.add_constant("cb", rng.standard_normal(4).astype(np.float32))
    h, y = sg.add_tensor("h", DType.FLOAT32, (1,)), sg.add_tensor("y", DType.FLOAT32, (1,))
    sg.inputs, sg.outputs = [x], [y]
    geometry = {"padding": padding, "stride_h": stride, "stride_w": stride,
                "dilation_h_factor": dilation, "dilation_w_factor": dilation}
    sg.add_operator("DEPTHWISE_CONV_2D", [x, dw, db], [h], version=2 if dilation > 1 else 1,
                    options={**geometry, "depth_multiplier": mult, "fused_activation_function": Activation.RELU})
    sg.add_operator("CONV_2D", [h, cw, cb], [y], options={**geometry, "fused_activation_function": Activation.TANH})
    # Output shapes come from kiln's reference run; write them into the file for LiteRT.
    probe = kiln.Interpreter(model_content=write_model(model), experimental_preserve_all_tensors=True)
    xv = rng.standard_normal((2, 13, 11, 3)).astype(np.float32)
    run(probe, [xv])
    h.shape, y.shape = probe.get_tensor(5).shape, probe.get_tensor(6).shape
    data = write_model(model)
    delegate = NumpyDelegate()
    (actual,) = run(kiln.Interpreter(model_content=data, experimental_delegates=[delegate]), [xv])
    (expected,) = run(litert(data), [xv])
    assert len(delegate.claimed) == 2
    assert_close(actual, expected, rtol=RTOL, atol=1e-6)


def test_large_convolutions_run_in_row_chunks(zoo, monkeypatch):
    """With a tiny im2col budget every convolution takes the chunked path; results agree."""
    from kiln.kernels import conv

    monkeypatch.setattr(conv, "FLOAT_IM2COL_BUDGET", 256)
    for name, batch in (("mobilenet", None), ("dynamic_batch", 3)):
        data = zoo.bytes(name)
        ref, ours = litert(data), kiln.Interpreter(model_content=data, experimental_delegates=[NumpyDelegate()])
        if batch:
            for interp in (ref, ours):
                interp.resize_tensor_input(0, [batch, 8, 8, 3])
        x = sample_inputs(ours.get_input_details(), 5)
        (actual,), (expected,) = run(ours, x), run(ref, x)
        assert_close(actual, expected, rtol=E2E_RTOL.get(name, RTOL), atol=ATOL, what=name)


def test_a_registered_op_is_claimed_and_matches_litert():
    """Support for a new op is one registration in the open table, nothing else."""
    from kiln.delegates import CompiledSupport, register_float

    model = Model()
    sg = model.add_subgraph("main")
    x, y = sg.add_tensor("x", DType.FLOAT32, (2, 5)), sg.add_tensor("y", DType.FLOAT32, (2, 5))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("EXP", [x], [y])
    data = write_model(model)
    assert ("EXP", None) not in LOWERINGS   # its integer nodes are registered, its float ones not
    register_float("EXP", CompiledSupport(frozenset({1})))
    try:
        delegate = NumpyDelegate()
        interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
        inputs = [np.linspace(-3, 3, 10, dtype=np.float32).reshape(2, 5)]
        (actual,) = run(interp, inputs)
    finally:
        LOWERINGS.unregister("EXP", [None])
    assert delegate.claimed == [(0, "EXP", 1)]
    (expected,) = run(litert(data), inputs)
    assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def _same_bits(actual, expected) -> bool:
    return all(a.dtype == e.dtype and a.shape == e.shape and a.tobytes() == e.tobytes()
               for a, e in zip(actual, expected)) and len(actual) == len(expected)


@pytest.mark.parametrize("name", list(ZOO))
def test_default_delegate_gives_the_reference_kernels_bits(zoo, name, kiln_default):
    """Without ai-edge-litert, the default Interpreter (NumPy delegate) and BUILTIN_REF
    (reference kernels alone) agree bit for bit, invoke after invoke. (With it, the default
    runs LiteRT's optimised kernels, which are not bit for bit LiteRT's reference ones.)"""
    data = zoo.bytes(name)
    default, reference = kiln.Interpreter(model_content=data), kiln.Interpreter(model_content=data, **REF)
    variables = [i for i, t in enumerate(default.model.subgraphs[0].tensors) if t.is_variable]
    for seed in (0, 1):
        inputs = sample_inputs(reference.get_input_details(), seed)
        assert _same_bits(run(default, inputs), run(reference, inputs)), f"{name} (seed {seed})"
        assert _same_bits([default.get_tensor(i) for i in variables], [reference.get_tensor(i) for i in variables])


@pytest.mark.parametrize("installed", ["litert", "kiln"])
def test_the_default_delegate_takes_what_the_users_delegate_leaves(zoo, installed, request):
    request.getfixturevalue(f"{installed}_default")
    user = NumpyDelegate(ops={"CONV_2D"})
    interp = kiln.Interpreter(model_content=zoo.bytes("cnn"), experimental_delegates=[user])
    run(interp, sample_inputs(interp.get_input_details()))
    default = interp._delegates[1]   # the default delegates follow: LiteRT's (if installed), then NumPy's
    expected_type = LiteRtDelegate if installed == "litert" else NumpyDelegate
    assert interp._delegates[0] is user and isinstance(default, expected_type) and default is not user
    assert [name for _, name, _ in user.claimed] == ["CONV_2D", "CONV_2D"]
    assert [name for _, name, _ in default.claimed] == ["MAX_POOL_2D", "AVERAGE_POOL_2D", "RESHAPE", "FULLY_CONNECTED"]
    assert [s.op_names for s in steps_of(interp)] == [
        ("CONV_2D",), ("MAX_POOL_2D",), ("CONV_2D",), ("AVERAGE_POOL_2D", "RESHAPE", "FULLY_CONNECTED")]


@pytest.mark.parametrize("installed", ["litert", "kiln"])
@pytest.mark.parametrize("kind", list(kiln.OpResolverType))
def test_resolver_types_choose_the_default_delegate(zoo, kind, installed, request):
    from ai_edge_litert.interpreter import OpResolverType as LiteRTType

    request.getfixturevalue(f"{installed}_default")
    default = "litert" if installed == "litert" else "numpy"
    for given in (kind, getattr(LiteRTType, kind.name)):  # LiteRT's enum is accepted as well
        interp = kiln.Interpreter(model_content=zoo.bytes("mlp"), experimental_op_resolver_type=given)
        run(interp, sample_inputs(interp.get_input_details()))
        delegated = {e.delegate for e in steps_of(interp)}
        assert delegated == ({default} if kind.applies_default_delegates else {None}), kind


def test_bad_resolver_types_are_refused(zoo):
    with pytest.raises(TypeError, match="experimental_op_resolver_type must be an OpResolverType"):
        kiln.Interpreter(model_content=zoo.bytes("mlp"), experimental_op_resolver_type="BUILTIN_REF")


def test_preserving_all_tensors_runs_without_the_default_delegate(zoo):
    interp = kiln.Interpreter(model_content=zoo.bytes("cnn"), experimental_preserve_all_tensors=True)
    run(interp, sample_inputs(interp.get_input_details()))
    assert {e.delegate for e in steps_of(interp)} == {None}
    assert all(interp.get_tensor(d["index"]) is not None for d in interp.get_tensor_details())


POOLS = [(padding, stride, filter_hw, act) for padding in (Padding.SAME, Padding.VALID) for stride in (1, 2)
         for filter_hw in ((2, 2), (3, 2)) for act in (Activation.NONE, Activation.RELU6)]


@pytest.mark.parametrize("op_type", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("padding, stride, filter_hw, act", POOLS)
def test_pool_lowerings_give_the_kernels_bits(op_type, padding, stride, filter_hw, act):
    from tests.harness import single_op_model

    x = np.random.default_rng(stride).standard_normal((2, 7, 6, 3)).astype(np.float32)
    x.reshape(-1)[:3] = (np.inf, -np.inf, -0.0)
    options = {"padding": padding, "stride_h": stride, "stride_w": stride, "filter_height": filter_hw[0],
               "filter_width": filter_hw[1], "fused_activation_function": act}
    data = single_op_model(op_type, [x], options=options)
    delegate = NumpyDelegate()
    compiled = kiln.Interpreter(model_content=data, experimental_delegates=[delegate], **NO_DEFAULT)
    assert _same_bits(run(compiled, [x]), run(kiln.Interpreter(model_content=data, **REF), [x]))
    assert len(delegate.claimed) == 1


@pytest.mark.parametrize("act", list(Activation))
def test_the_delegates_clamp_is_np_clip_bit_for_bit(act):
    from kiln.delegates.compiled import clamp
    from kiln.ops.elementwise import activation_range

    x = (np.random.default_rng(0).standard_normal(300) * 4).astype(np.float32)
    x[:10] = [np.inf, -np.inf, np.nan, -0.0, 0.0, 6, -6, 1, -1, np.finfo(np.float32).max]
    lo, hi = activation_range(act, np.dtype(np.float32))
    for n in (1, 7, 33, 300):  # scalar and vector loops of the ufuncs
        y = x[:n].copy()
        clamp(lo, hi)(y)
        assert _same_bits([y], [np.clip(x[:n], lo, hi)])


def test_float_overflow_in_a_partition_does_not_warn(kiln_default):
    """Like the reference kernels, a chain saturates to infinity (then FLT_MAX) silently.
    (LiteRT's XNNPACK, the default with ai-edge-litert, leaves infinity.)"""
    import warnings

    from tests.harness import single_op_model

    big = np.full(4, 3e38, np.float32)
    data = single_op_model("ADD", [big, big])
    interp = kiln.Interpreter(model_content=data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = run(interp, [big, big])
    assert np.all(y == np.finfo(np.float32).max) and {e.delegate for e in steps_of(interp)} == {"numpy"}


def test_a_node_computing_on_constants_stays_on_its_kernel():
    """The default delegate's TRANSPOSE reads its data at run time: a TRANSPOSE of constants
    (a model no converter folded) runs on the reference kernel."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, [2, 3])
    sg.inputs.append(x)
    c = sg.add_constant("c", np.arange(6, dtype=np.float32).reshape(3, 2))
    perm = sg.add_constant("perm", np.array([1, 0], np.int32), DType.INT32)
    t = sg.add_tensor("t", DType.FLOAT32, [2, 3])
    sg.add_operator("TRANSPOSE", [c, perm], [t])
    y = sg.add_tensor("y", DType.FLOAT32, [2, 3])
    sg.add_operator("ADD", [x, t], [y])
    sg.outputs.append(y)
    interp = kiln.Interpreter(model_content=write_model(model))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ones((2, 3), np.float32))
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]),
                                  1 + np.arange(6, dtype=np.float32).reshape(3, 2).T)


@pytest.mark.parametrize("budget", [None, 0])
def test_depthwise_sums_alike_in_one_buffer_and_tap_by_tap(monkeypatch, budget):
    """The NumPy delegate's depthwise products buffer (kept by its plan, reused every invoke) and
    the tap-by-tap sum past DEPTHWISE_BUDGET give the reference kernel's bits, invoke after invoke."""
    from kiln.kernels import conv
    if budget is not None:
        monkeypatch.setattr(conv, "DEPTHWISE_BUDGET", budget)
    rng = np.random.default_rng(7)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 9, 7, 3))
    w = sg.add_constant("w", rng.standard_normal((1, 3, 3, 6)).astype(np.float32))
    b = sg.add_constant("b", rng.standard_normal(6).astype(np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 5, 4, 6))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("DEPTHWISE_CONV_2D", [x, w, b], [y], options={
        "padding": Padding.SAME, "stride_h": 2, "stride_w": 2, "depth_multiplier": 2,
        "fused_activation_function": Activation.NONE})
    data = write_model(model)
    ref = kiln.OpResolverType.BUILTIN_REF
    delegated = kiln.Interpreter(model_content=data, experimental_op_resolver_type=ref,
                                 experimental_delegates=[NumpyDelegate()])
    reference = kiln.Interpreter(model_content=data, experimental_op_resolver_type=ref)
    outputs = []
    for _ in range(3):
        xs = rng.standard_normal((1, 9, 7, 3)).astype(np.float32)
        (got,), (want,) = run(delegated, [xs]), run(reference, [xs])
        np.testing.assert_array_equal(got, want)
        outputs.append(got)
    assert not np.array_equal(outputs[0], outputs[1])   # each invoke's own answer, not a kept buffer's
    assert steps_of(delegated)   # the node ran in the delegate
