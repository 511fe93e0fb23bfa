"""Every converter-zoo model — kiln's conversion and TensorFlow's — through XlaDelegate:
every node claimed (TensorFlow's TensorList loops included: slices with the loop counter,
lists with a free batch) and equal to TensorFlow's outputs within the converter zoo's own
tolerance (tests/converter/test_zoo.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.converter import zoo  # noqa: E402
from tests.converter.test_zoo import assert_matches, litert, run_signature  # noqa: E402


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
    assert not delegate.rejected, f"{case.name}: nodes not claimed: {delegate.rejected}"


def _float_weights(model_bytes: bytes, key: str) -> set[str]:
    """Names of the float constants of rank >= 1 that signature ``key``'s subgraph reads,
    with those of the subgraphs its WHILE / IF nodes call."""
    from kiln import ops
    from kiln.format import read_model

    model = read_model(model_bytes)
    sig = next(s for s in model.signatures if s.key == key)
    names, pending, seen = set(), [sig.subgraph], set()
    while pending:
        sg = pending.pop()
        if id(sg) in seen:
            continue
        seen.add(id(sg))
        for op in sg.operators:
            names.update(t.name for t in op.inputs if t is not None and t.is_constant
                         and t.dtype.is_float and len(t.shape) >= 1)
            pending.extend(model.subgraphs[int(op.options[f])] for f in ops.subgraph_fields(op))
    return names


@pytest.mark.slow
@pytest.mark.parametrize("converter", ["kiln", "tf"])
def test_to_jax_params_hold_every_float_weight(case, converter):
    """Fused-RNN weights and loop-body weights included: a user who fine-tunes or shares the
    weights gets all of them, none baked into the function."""
    model = case.kiln_model if converter == "kiln" else case.tf_model
    if model is None or (converter == "tf" and not litert(model).get_signature_list()):
        pytest.skip("no signature to convert")
    for key in case.source.feeds:
        fn, params = kiln.to_jax(model, key)
        names = {name.rstrip("_") for name in params}
        missing = _float_weights(model, key) - names
        assert not missing, f"{case.name} ({converter}), signature {key}: weights not in params: {sorted(missing)}"
