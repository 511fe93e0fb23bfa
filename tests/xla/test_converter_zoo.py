"""Every converter-zoo model — kiln's conversion and TensorFlow's — through XlaDelegate:
claimed except for the ops listed here with the reason, and equal to TensorFlow's outputs
within the converter zoo's own tolerance (tests/converter/test_zoo.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.converter import zoo  # noqa: E402
from tests.converter.test_zoo import assert_matches, litert, run_signature  # noqa: E402

#: Why a node may stay on the reference kernels (a phrase of the delegate's reason): XLA's
#: static shapes.
ALLOWED_REASONS = {
    "only known at run time": "XLA compiles static shapes (TF's TensorList reads with run-time sizes)",
    "a size of -1": "a slice to the end from a run-time begin has no static shape",
    "may change shape between trips": "XLA's while loop carries one shape (TensorLists with a free batch)",
}
#: Ops that stay on the reference kernels, and why (none now: resource variables are claimed).
NOT_LOWERED: dict[str, str] = {}


@pytest.fixture(scope="module", params=list(zoo.BUILDERS))
def case(request):
    return zoo.case(request.param)


@pytest.mark.slow
@pytest.mark.parametrize("converter", ["kiln", "tf"])
def test_zoo_model_through_xla(case, converter):
    model = case.kiln_model if converter == "kiln" else case.tf_model
    if model is None:
        pytest.skip(f"TF's converter cannot convert {case.name}")
    if converter == "tf" and not litert(model).get_signature_list():
        pytest.skip("TF wrote no SignatureDef for this model (functions returning tuples)")
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate])
    for key, feeds in case.source.feeds.items():
        out = run_signature(interp, key, feeds)
        if case.name == "sm_variables" or converter == "tf":
            expected = run_signature(litert(model), key, feeds)  # TF's file: LiteRT is the oracle
        else:
            expected = case.source.reference[key]
        assert_matches(out, expected, f"{case.name} ({converter}'s conversion) through XLA")
    assert delegate.claimed, "nothing claimed"
    for (index, op_name, _), reason in delegate.rejected.items():
        allowed = op_name in NOT_LOWERED or any(phrase in reason for phrase in ALLOWED_REASONS)
        assert allowed, f"{case.name}: node {index} ({op_name}) not claimed: {reason}"
