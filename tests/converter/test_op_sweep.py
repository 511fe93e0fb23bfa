"""The op sweep (tests/converter/op_sweep.py): every TF op TF 2.21's converter lowers to LiteRT
builtins has a one-op case — converted by TF's converter and kiln's, kiln's file run in LiteRT,
kiln's default Interpreter and BUILTIN_REF and compared with TF eager, with no more ops than
TF's file and TF's op versions — or an exclusion that says why.

The fast lane checks the bookkeeping (every op covered or excluded, each case's graph holds the
ops it claims) and runs a representative handful; the slow lane runs every case.
"""

from __future__ import annotations

import pytest

from tests.converter import op_sweep

pytest.importorskip("tensorflow")
pytest.importorskip("ai_edge_litert")

#: A handful covering the issue's findings (fused forms, folded shapes, empty outputs,
#: integers LiteRT reads as quantized) and the common kinds of op.
FAST = ("add_broadcast", "reduce_variance", "l2_normalize", "rgb_to_grayscale", "shape", "where_empty",
        "conv2d", "select_rows", "relu_int", "div_no_nan", "gather_nd", "while", "ones_like_dynamic", "top_k",
        "unique_of_nothing")


@pytest.fixture(scope="module")
def cases():
    return op_sweep.cases()


def test_every_legalized_op_has_a_case_or_a_reasoned_exclusion(cases):
    covered = {op for case in cases.values() for op in case.ops}
    legalized = set(op_sweep.TF_LEGALIZED)
    excluded = set(op_sweep.EXCLUDED)
    assert sorted(legalized - covered - excluded) == [], "TF ops with neither a sweep case nor an exclusion"
    assert sorted(excluded - legalized) == [], "exclusions of ops TF's converter does not legalize"
    assert sorted(excluded & covered) == [], "excluded ops that have a case after all"
    assert all(len(reason) > 20 for reason in op_sweep.EXCLUDED.values())


def test_each_case_s_graph_holds_the_ops_it_claims(cases):
    missing = {name: sorted(set(case.ops) - op_sweep.graph_op_types(op_sweep.concrete(case)))
               for name, case in cases.items()}
    assert {k: v for k, v in missing.items() if v} == {}


def test_known_gaps_and_refusals_name_cases(cases):
    assert sorted(op_sweep.KNOWN_GAPS - set(cases)) == []
    assert all(not cases[name].tf_refuses for name in op_sweep.KNOWN_GAPS)


def _check(case) -> None:
    try:
        problems = op_sweep.check(case)
    except op_sweep.Gap as gap:
        pytest.xfail(f"known gap: {str(gap)[:200]}")
    assert problems == [], f"{case.name}: " + "; ".join(problems)


@pytest.mark.parametrize("name", FAST)
def test_representative_cases(cases, name):
    _check(cases[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(op_sweep.cases()))
def test_sweep(cases, name):
    _check(cases[name])


def test_integers_litert_reads_as_quantized_are_refused_with_the_reason():
    """TF refuses an int8 AddV2 (it needs Select TF ops); so does kiln, saying why: LiteRT's ADD
    reads int8 operands as quantized, and these have no quantization parameters (the file
    aborted LiteRT and kiln's default Interpreter)."""
    import kiln

    case = op_sweep.cases()["add"]
    with pytest.raises(kiln.ConversionError) as info:
        op_sweep.convert_kiln(op_sweep.concrete(case, "int8"))
    assert "AddV2" in str(info.value)
    assert any("quantization parameters" in d for d in info.value.details), info.value.details


@pytest.mark.parametrize("name,dtype", [("relu_int", "int8"), ("add", "int16"), ("mul", "int16"), ("abs", "int16"),
                                        ("concat", "int8"), ("pack", "uint8")])
def test_integers_litert_takes_as_they_are_convert(name, dtype):
    """Where LiteRT's kernel takes the integers as they are (an int8 Relu is MAXIMUM(x, 0); int16
    ADD / MUL / ABS, the records' `takes_raw`; CONCATENATION / PACK, which requantize nothing
    when every operand shares its parameters), kiln converts them and LiteRT computes TF's values."""
    case = op_sweep.cases()[name]
    model, _ = op_sweep.convert_kiln(op_sweep.concrete(case, dtype))
    values = op_sweep.feeds(case, dtype)
    want = op_sweep.eager(case, values)[0]
    for runtime in ("litert", "kiln", "kiln_ref"):
        assert op_sweep.mismatch(op_sweep.run(model, values, runtime)[0], want, 0) is None, runtime


@pytest.mark.parametrize("mode", ["int8", "int16x8"])
def test_fused_forms_quantize(mode):
    """The fused forms kiln now writes quantize like any model: in int8, L2_NORMALIZATION and
    SQUARED_DIFFERENCE become int8 ops (version 2, as TF writes them) whose results are LiteRT
    BUILTIN_REF's bits; 16x8 keeps them float (LiteRT has no int16 kernel for them) between a
    DEQUANTIZE and a QUANTIZE; either way the values stay near the float model's."""
    import numpy as np
    import tensorflow as tf

    import kiln

    @tf.function(input_signature=[tf.TensorSpec([4, 8], tf.float32)])
    def f(x):
        return tf.math.l2_normalize(x, -1), tf.math.reduce_variance(x, -1, keepdims=True)

    float_model = kiln.TFLiteConverter.from_concrete_functions([f.get_concrete_function()]).convert()
    assert {"L2_NORMALIZATION", "SQUARED_DIFFERENCE"} <= set(op_sweep.op_versions(float_model))
    rng = np.random.default_rng(3)
    samples = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(16)]
    q = kiln.quantize(float_model, mode, representative_dataset=[[s] for s in samples], progress=False)
    versions = op_sweep.op_versions(q)
    expected = {2} if mode == "int8" else {1}
    assert versions["L2_NORMALIZATION"] == versions["SQUARED_DIFFERENCE"] == expected, versions
    x = samples[0]
    want = op_sweep.run(float_model, [x], "kiln_ref")
    got, ref = op_sweep.run(q, [x], "kiln_ref"), op_sweep.run(q, [x], "litert_ref")
    tol = 0 if mode == "int8" else 1e-6  # 16x8: the float ops round as float kernels do
    assert all(np.allclose(g, r, rtol=0, atol=tol) for g, r in zip(got, ref))
    for g, w in zip(got, want):
        assert np.max(np.abs(g - w)) <= 0.05 * max(1.0, float(np.max(np.abs(w))))


def test_the_converter_coverage_is_what_the_emitters_write():
    """docs/support_matrix.md's converter coverage is read from the emitters; a lowering a
    conversion reports that it does not list is a drift the sweep names."""
    from types import SimpleNamespace

    from kiln import support_matrix

    declared = op_sweep.declared_lowerings()
    assert declared["AddV2"] == {"ADD"} and declared["l2_normalization"] == {"L2_NORMALIZATION"}
    assert declared["Relu"] == {"RELU", "MAXIMUM"} and declared["SpaceToDepth"] == {"SPACE_TO_DEPTH"}
    assert op_sweep.undeclared_lowerings(SimpleNamespace(lowered={"AddV2": ["ADD"]})) == []
    (drift,) = op_sweep.undeclared_lowerings(SimpleNamespace(lowered={"AddV2": ["ADD", "MUL"]}))
    assert drift.startswith("AddV2 lowered to ['MUL']")
    covered, passed = support_matrix.converter_coverage()
    assert "*l2_normalization*" in covered["L2_NORMALIZATION"] and "Identity" in passed


@pytest.mark.slow
def test_the_exclusions_reasons_hold():
    """Each kind of exclusion, checked by running TensorFlow: the quantization-only ops become
    QUANTIZE / DEQUANTIZE in TF's file while kiln refuses them; XlaSharding is no raw op and
    BatchNormWithGlobalNormalization cannot be traced; the variable ops are the zoo's; the hash
    tables TF refuses (case hash_table_lookup) kiln refuses too."""
    import tensorflow as tf

    import kiln
    from tests.converter import zoo

    fake_quant = tf.function(lambda x: tf.quantization.fake_quant_with_min_max_args(x, -1.0, 1.0),
                             input_signature=[tf.TensorSpec([2, 4])]).get_concrete_function()
    tf_model, error = op_sweep.convert_tf(fake_quant)
    assert tf_model is not None, error
    assert set(op_sweep.op_versions(tf_model)) == {"QUANTIZE", "DEQUANTIZE"}
    with pytest.raises(kiln.ConversionError, match="FakeQuantWithMinMaxArgs"):
        op_sweep.convert_kiln(fake_quant)
    assert not hasattr(tf.raw_ops, "XlaSharding")
    with pytest.raises(Exception, match="GraphDef version"):
        op_sweep.concrete(op_sweep.Case("bn", (), lambda x: tf.raw_ops.BatchNormWithGlobalNormalization(
            t=x, m=[0.0], v=[1.0], beta=[0.0], gamma=[1.0], variance_epsilon=1e-3, scale_after_normalization=True),
            (op_sweep.f32(1, 2, 2, 1),)))
    assert "sm_variables" in zoo.BUILDERS
    with pytest.raises(kiln.ConversionError, match="LookupTableFindV2"):  # kiln converts no hash table either
        op_sweep.convert_kiln(op_sweep.concrete(op_sweep.cases()["hash_table_lookup"]))


@pytest.mark.parametrize("name,dtype,op_type", [("cumsum", "int8", "CUMSUM"), ("gather", "float64", "GATHER"),
                                                ("max_pool", "int32", "MAX_POOL_2D")])
def test_types_litert_does_not_run_are_refused_as_by_tf(name, dtype, op_type):
    """kiln writes no builtin for an operand type its record says LiteRT does not run (`OpDef.types`;
    the file failed in LiteRT): the conversion is refused naming the op and the type, as TF's is."""
    import kiln

    fn = op_sweep.concrete(op_sweep.cases()[name], dtype)
    with pytest.raises(kiln.ConversionError) as info:
        op_sweep.convert_kiln(fn)
    assert any(f"LiteRT's {op_type} takes no {dtype} operands" in d for d in info.value.details), info.value.details
    assert op_sweep.convert_tf(fn)[0] is None


@pytest.mark.parametrize("name,dtype,ops", [("square", "int32", {"MUL"}), ("add_n", "int64", {"ADD"}),
                                            ("pack", "bool", {"EXPAND_DIMS", "CONCATENATION"}),
                                            ("zeros_like_dynamic", "int8", {"SHAPE", "BROADCAST_TO"}),
                                            ("squared_difference", "int64", {"SUB", "MUL"})])
def test_types_a_builtin_does_not_take_are_lowered_as_tf_lowers_them(name, dtype, ops):
    """Where the builtin takes no such type, kiln writes what TF's converter writes instead
    (Square as MUL, AddN as ADDs, Pack as EXPAND_DIMS + CONCATENATION, ZerosLike as a
    BROADCAST_TO, SquaredDifference as SUB + MUL), and LiteRT and kiln compute TF's values."""
    case = op_sweep.cases()[name]
    model, _ = op_sweep.convert_kiln(op_sweep.concrete(case, dtype))
    assert set(op_sweep.op_versions(model)) == ops
    values = op_sweep.feeds(case, dtype)
    want = op_sweep.eager(case, values)[0]
    for runtime in ("litert", "kiln", "kiln_ref"):
        assert op_sweep.mismatch(op_sweep.run(model, values, runtime)[0], want, 0) is None, runtime


def test_what_tf_s_converter_refuses_around_the_new_lowerings():
    """An NCHW DepthwiseConv2dNative (TF's converter refuses it) takes the same TRANSPOSEs as
    Conv2D and computes TF's values; a TensorList that grows inside a loop is refused with the
    reason (TF's converter refuses it too: its shape changes at every step)."""
    import numpy as np
    import tensorflow as tf

    import kiln
    from tensorflow.python.ops import list_ops

    w = tf.constant(np.random.default_rng(1).standard_normal((3, 3, 2, 2)).astype(np.float32))
    case = op_sweep.Case("dw_nchw", (), lambda x: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME",
                                                                        data_format="NCHW"), (op_sweep.f32(1, 2, 6, 6),))
    model, _ = op_sweep.convert_kiln(op_sweep.concrete(case))
    assert set(op_sweep.op_versions(model)) == {"TRANSPOSE", "DEPTHWISE_CONV_2D"}
    values = op_sweep.feeds(case)
    want = op_sweep.eager(case, values)[0]
    for runtime in ("litert", "kiln"):
        assert op_sweep.mismatch(op_sweep.run(model, values, runtime)[0], want, 1e-4) is None, runtime

    def grow(x):
        handle = list_ops.empty_tensor_list(element_shape=[4], element_dtype=tf.float32)
        _, handle = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, list_ops.tensor_list_push_back(h, x[i])),
                                  (0, handle))
        return list_ops.tensor_list_stack(handle, tf.float32, element_shape=[4])

    with pytest.raises(kiln.ConversionError) as info:
        op_sweep.convert_kiln(op_sweep.concrete(op_sweep.Case("grow", (), grow, (op_sweep.f32(3, 4),))))
    assert any("grows inside a loop" in d for d in info.value.details)
