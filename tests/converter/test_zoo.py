"""Every zoo model: kiln's conversion runs in LiteRT and in kiln's Interpreter and matches
TensorFlow; it is no larger (ops, bytes) than TF's converter's; its (op, version) pairs are
the ones TF's converter writes."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.converter import zoo

NAMES = list(zoo.BUILDERS)
#: Models where kiln's op versions legitimately differ from TF's: name -> why.
VERSION_DIFFERENCES = {
    "k3_dilated": "kiln fuses SPACE_TO_BATCH_ND + conv + BATCH_TO_SPACE_ND into dilated convs "
                  "(DEPTHWISE_CONV_2D v2); TF keeps the three ops",
}
#: Ops kiln may write where TF's converter writes others, by design: op -> why.
KILN_ONLY_OPS = {
    "RELU": "a FULLY_CONNECTED whose raw output is read too keeps a standalone activation (TF fuses "
            "it into a second copy of the FC: more arithmetic)",
    "RELU6": "as RELU",
    "DYNAMIC_UPDATE_SLICE": "TensorList writes lower to an update in place (TF: SLICE + CONCATENATION)",
    "EXPAND_DIMS": "the item of a TensorList write",
    "PACK": "the start index of a TensorList write",
}


def run_signature(interp, key: str, feeds: dict) -> dict:
    runner = interp.get_signature_runner(key)
    if "__first__" in feeds:
        (name,) = interp.get_signature_list()[key]["inputs"]
        feeds = {name: feeds["__first__"]}
    return runner(**feeds)


def litert(model: bytes):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model)


def kiln_interpreter(model: bytes):
    import kiln

    return kiln.Interpreter(model_content=model)


def assert_matches(out: dict, ref: dict, what: str, rel: float = 1e-5) -> None:
    assert set(out) == set(ref), f"{what}: outputs {sorted(out)} != {sorted(ref)}"
    for name, expected in ref.items():
        got = np.asarray(out[name])
        expected = np.asarray(expected)
        assert got.shape == expected.shape, f"{what}: {name} shape {got.shape} != {expected.shape}"
        scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-6)
        err = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
        assert err <= rel * scale + 1e-7, f"{what}: {name} differs by {err:.3g} (scale {scale:.3g})"


@pytest.fixture(scope="module", params=zoo.params(NAMES))
def case(request):
    return zoo.case(request.param)


def test_runs_in_litert_like_tensorflow(case):
    for key, feeds in case.source.feeds.items():
        out = run_signature(litert(case.kiln_model), key, feeds)
        assert_matches(out, case.source.reference[key], f"{case.name} LiteRT")


def test_runs_in_kiln_like_tensorflow(case):
    for key, feeds in case.source.feeds.items():
        out = run_signature(kiln_interpreter(case.kiln_model), key, feeds)
        assert_matches(out, case.source.reference[key], f"{case.name} kiln")


def test_signatures_like_tf(case):
    if case.tf_model is None:
        pytest.skip(f"TF's converter fails: {case.tf_error[:120]}")
    ours, theirs = litert(case.kiln_model).get_signature_list(), litert(case.tf_model).get_signature_list()
    if not theirs:  # TF writes no SignatureDef for functions returning tuples; kiln does
        assert list(ours) == ["serving_default"]
        return
    assert ours == theirs


def test_not_larger_than_tf(case):
    if case.tf_model is None:
        assert case.source.tf_fails, f"TF's converter failed unexpectedly: {case.tf_error}"
        pytest.skip("TF's converter cannot convert this model; kiln can")
    assert not case.source.tf_fails, "TF's converter now converts this model: update the zoo"
    assert zoo.op_count(case.kiln_model) <= zoo.op_count(case.tf_model)
    assert len(case.kiln_model) <= len(case.tf_model)


def test_never_more_arithmetic_than_tf(case):
    """Multiply-accumulates at run-time shapes: no rewrite may add arithmetic."""
    if case.tf_model is None:
        pytest.skip("TF's converter cannot convert this model")
    for key, feeds in case.source.feeds.items():
        ours, theirs = zoo.run_macs(case.kiln_model, key, feeds), zoo.run_macs(case.tf_model, key, feeds)
        assert ours <= theirs, f"{key}: kiln {ours} MACs > TF {theirs}"


@pytest.mark.parametrize("name, op_type", [("k3_squeeze_excite", "MEAN"), ("k3_attention_fresh", "ADD")])
def test_no_leftovers_tf_removes(name, op_type):
    """A pooling over a 1×1 map and zero-bias ADDs after attention projections / LayerNorm
    (dynamic batch and sequence) are gone, as in TF's conversion."""
    case = zoo.case(name)
    count = {label: sum(1 for _, _, op in kiln.read_model(m).operators() if op.name == op_type)
             for label, m in (("kiln", case.kiln_model), ("tf", case.tf_model))}
    assert count["kiln"] <= count["tf"], count


@pytest.mark.parametrize("name", ["k3_transformer", "k3_causal_attention"])
def test_layer_norm_variance_is_one_squared_difference_as_in_tf(name):
    """Keras LayerNormalization's variance: one SQUARED_DIFFERENCE each, as TF writes it (its graph
    has SquaredDifference; a variance traced as Square(Sub) fuses too: the op sweep's
    reduce_variance / reduce_std cases)."""
    case = zoo.case(name)
    count = {label: {op: sum(1 for _, _, o in kiln.read_model(m).operators() if o.name == op)
                     for op in ("SQUARED_DIFFERENCE", "SQUARE")}
             for label, m in (("kiln", case.kiln_model), ("tf", case.tf_model))}
    assert count["kiln"] == count["tf"] and count["tf"]["SQUARED_DIFFERENCE"] > 0, count


def test_op_versions_like_tf(case):
    """Every (op, version) kiln writes is one TF's converter writes for the same model."""
    if case.tf_model is None:
        pytest.skip("TF's converter cannot convert this model")
    if case.name in VERSION_DIFFERENCES:
        pytest.skip(VERSION_DIFFERENCES[case.name])
    ours, theirs = zoo.op_pairs(case.kiln_model), zoo.op_pairs(case.tf_model)
    common = {op for op, _ in ours} & {op for op, _ in theirs}
    assert {p for p in ours if p[0] in common} == {p for p in theirs if p[0] in common}
    extra = {p for p in ours if p[0] not in common and p[0] not in KILN_ONLY_OPS}
    assert not extra, f"kiln writes ops TF does not: {sorted(extra)}"


def test_min_runtime_version_like_tf(case):
    import kiln

    if case.tf_model is None or case.name in VERSION_DIFFERENCES:
        pytest.skip("no comparable TF model")
    ours = kiln.read_model(case.kiln_model).metadata["min_runtime_version"]
    theirs = kiln.read_model(case.tf_model).metadata["min_runtime_version"]
    assert len(ours) == 16
    ours_pairs, theirs_pairs = zoo.op_pairs(case.kiln_model), zoo.op_pairs(case.tf_model)
    if ours_pairs == theirs_pairs:
        assert ours == theirs
    elif ours_pairs <= theirs_pairs:
        from kiln.format.runtime_version import _key

        # kiln may drop ops TF keeps, so its minimum can only be lower or equal.
        assert _key(ours.rstrip(b"\0").decode()) <= _key(theirs.rstrip(b"\0").decode())


@pytest.mark.parametrize("name", ["k3_cnn", "k3_transformer", "fn_control_flow", "sm_variables", "k3_gru_static"])
def test_ir_invariants_hold_after_every_pass(name):
    conv = zoo.kiln_converter(zoo.case(name).source)
    conv.experimental_verify_passes = True
    assert zoo.op_pairs(conv.convert()) == zoo.op_pairs(zoo.case(name).kiln_model)
