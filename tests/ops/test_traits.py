"""The records' number-format traits agree with their kernels.

The quantizer writes an op with integer (or hybrid) operands only where the op's record says
LiteRT has such a kernel (`kiln.ops.traits.Quantization`); the records' ``quantized`` kernels
are what kiln's runtime runs. These tests tie the two: a trait without a kernel is a model
kiln writes and then refuses to run (how int8 SUM slipped through before the traits lived on
the records).
"""

from __future__ import annotations

import pytest

from kiln import ops
from kiln.ops.record import HYBRID, UINT8
from kiln.ops.traits import OutputScale

QUANTIZED = sorted(name for name, r in ops.OPS.items() if r.quantization is not None)

#: Known gaps, each with the issue that closes it: LiteRT runs these, kiln's runtime does not yet.
KNOWN_GAPS: dict = {}


def _pairs():
    for name in QUANTIZED:
        q = ops.require(name).quantization
        for key in sorted(q.types) + ([HYBRID] if q.hybrid else []):
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name, key])] if (name, key) in KNOWN_GAPS else []
            yield pytest.param(name, key, id=f"{name}-{key}", marks=marks)


@pytest.mark.parametrize("name,key", list(_pairs()))
def test_every_type_the_quantizer_writes_has_a_kernel(name, key):
    record = ops.require(name)
    assert key in record.quantized, (
        f"{name}: its quantization trait lets the quantizer write {key} operands, but the record has no "
        f"{key} kernel (kernels: {sorted(record.quantized)}); add the kernel or drop {key} from the trait")


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantization_traits_are_complete(name):
    record = ops.require(name)
    q = record.quantization
    assert UINT8 not in q.types, "uint8 activations come only from TF1 models; the quantizer writes int8 / int16"
    if q.output == OutputScale.FIXED:
        assert set(q.fixed) == set(q.types), f"{name}: fixed output parameters for {sorted(q.types)}"
    else:
        assert not q.fixed
    if q.hybrid or q.int4_weights:
        assert record.weights is not None, f"{name}: a hybrid / int4 kernel needs the record's weights operands"
    if record.weights is not None and q.output == OutputScale.OWN:
        assert q.activations == (record.weights.input,), f"{name}: the weighted input is the one activation"
    assert all(i not in q.activations for i in (record.weights.operands if record.weights else ()))


def test_weights_name_real_operands():
    for name, record in ops.OPS.items():
        w = record.weights
        if w is None:
            continue
        if record.operands:
            n = len(record.operands)
            assert all(i < n for i in w.operands) and (w.bias is None or w.bias < n), name
        assert w.axis is None or w.axis >= 0


def test_sum_is_quantized_to_int8_only():
    """TF writes int8 SUM and leaves it float in 16x8; kiln's int8 SUM is LiteRT's optimized
    kernel (its reference one reads int8 codes as uint8: tests/quant/test_sum.py)."""
    record = ops.require("SUM")
    assert record.quantization.types == frozenset({"int8"}) and "int8" in record.quantized
