"""Cross-backend drift on real nodes: for every one-op model kiln's quantizer writes
(tests/quant/test_one_op_conformance.py's models, int8 / 16x8 / dynamic as each op's trait
allows), each kiln backend that runs the op at all — the NumPy delegate, XLA — claims the
node when offered it (every check of its table entry passes), unless the pair is one of the
table gaps tests/test_support_matrix.py names (`TABLE_GAPS`).
The table-level half (each pair registered) is tests/test_support_matrix.py; whether LiteRT's
BUILTIN_REF runs the pair and agrees is test_one_op_conformance's."""

from __future__ import annotations

import pytest

import kiln
from kiln.delegates import LOWERINGS as NUMPY_LOWERINGS
from kiln.delegates import NumpyDelegate
from kiln.ops.backends import key_name
from kiln.ops.record import operand_types
from tests.quant.one_op_models import one_op_models
from tests.quant.test_one_op_conformance import MODES, integer, modes_of, quantized
from tests.test_support_matrix import TABLE_GAPS


def _backends():
    """(matrix letter, table, delegate class) of the kiln backends here."""
    out = [("N", NUMPY_LOWERINGS, NumpyDelegate)]
    try:
        from kiln.xla import XlaDelegate, table
        table.lowered_ops()
        out.append(("X", table.LOWERINGS, XlaDelegate))
    except ImportError:   # no JAX: the XLA half is not checked here
        pass
    return out


def _cases():
    for model in one_op_models():
        for mode in modes_of(model):
            if mode == "dynamic" or integer(model.op, mode):
                yield pytest.param(model.name, mode, id=f"{model.name}-{mode}")


@pytest.mark.parametrize("name,mode", list(_cases()))
def test_each_backend_running_the_op_claims_the_quantizers_node(name, mode):
    assert mode in MODES
    content = quantized(name, mode)
    nodes = kiln.read_model(content).main.operators
    problems = []
    for letter, table, delegate_type in _backends():
        delegate = delegate_type()
        interp = kiln.Interpreter(model_content=content, experimental_delegates=[delegate],
                                  experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
        interp.allocate_tensors()   # nodes are offered to the delegate here
        for (index, op_name, _), reason in delegate.rejected.items():
            if op_name in ("QUANTIZE", "DEQUANTIZE") or not table.types_of(op_name):
                continue   # the model's edges; an op the backend does not run at all
            key = key_name(operand_types(nodes[index]))
            if (letter, op_name, key) not in TABLE_GAPS:
                problems.append(f"{letter}: {op_name} with {key} operands (node {index}): {reason}")
    assert not problems, f"{name} {mode}: {problems}"
