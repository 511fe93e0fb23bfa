"""Every quantized lowering over the quantized kernels' own one-op sweeps.

The tests of tests/quant that build one-op integer (or hybrid) models through
`tests.quant.test_dispatch.check` or `tests.quant.test_compiled_quant.delegated` are
collected here a second time, with kiln's side run under an XlaDelegate that must claim the
node: integer outputs equal kiln's reference kernel and LiteRT's BUILTIN_REF bit for bit, on
several fresh inputs (float outputs of hybrid nodes: to float32 rounding). A node the
delegate refuses fails the test unless its reason is a listed gap, which skips it with the
delegate's reason (listed in the report, so the gaps stay visible); today none is.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("jax")

#: `make test` runs each function's first case and one in 3; the whole sweep runs over both lanes (conftest.py).
FAST_LANE_SHARE = 3

import kiln  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from tests.quant import test_16x8_kernels, test_compiled_quant, test_compiled_quant_more, test_dispatch  # noqa: E402
from tests.quant import test_more_ops  # noqa: E402
from tests.quant.test_compiled_quant import REF, _fresh  # noqa: E402
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, one_op, reference  # noqa: E402

SOURCES = (test_dispatch, test_compiled_quant, test_compiled_quant_more, test_more_ops, test_16x8_kernels)
#: Reasons under which a refused node is a known gap (skipped), not a failure: none since
#: issue #11 — every sweep's node lowers. A new gap goes here with the delegate's exact reason.
GAPS: tuple[str, ...] = ()


def _collect():
    found = {}
    for module in SOURCES:
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            source = inspect.getsource(fn)
            if ("delegated(" in source or "check(" in source) and "raises" not in source \
                    and "delegate." not in source and "_delegates" not in source:
                found[f"test_{module.__name__.rsplit('.', 1)[1][5:]}__{name[5:]}"] = (module, fn)
    return found


SWEEPS = _collect()
MODULE_OF = {fn: module for module, fn in SWEEPS.values()}
for _name, (_module, _fn) in SWEEPS.items():
    globals()[_name] = _fn


def _claimed(delegate, op_type):
    for (index, op_name, _), reason in delegate.rejected.items():
        if any(gap in reason for gap in GAPS):
            pytest.skip(f"node {index} ({op_name}): {reason}")
        pytest.fail(f"XlaDelegate refused node {index} ({op_name}): {reason}")
    assert [name for _, name, _ in delegate.claimed] == [op_type]


def _same(got, want, what):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, what
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())), err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def xla_delegated(op_type, operands, outputs, options=None, *, invokes: int = 3, lowered: bool = True):
    model, _ = one_op(op_type, operands, outputs, options)
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF)
    kiln_ref = kiln.Interpreter(model_content=model, **REF)
    interp.allocate_tensors()
    _claimed(delegate, op_type)
    for seed in range(invokes):
        feeds = [o.value for o in _fresh(operands, seed) if isinstance(o, In) and not isinstance(o, Const)]
        got = run_api(interp, feeds)
        _same(got, run_api(kiln_ref, feeds), f"{op_type}, XLA vs kiln's kernel, invoke {seed}")
        _same(got, reference(model, feeds), f"{op_type}, XLA vs BUILTIN_REF, invoke {seed}")
    return delegate


def xla_check(op_type, operands, outputs, options=None, *, rtol: float = 0.0):
    model, feeds = one_op(op_type, operands, outputs, options)
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate], **REF)
    interp.allocate_tensors()
    _claimed(delegate, op_type)
    got = run_api(interp, feeds)
    for want in (run_api(kiln.Interpreter(model_content=model, **REF), feeds), reference(model, feeds)):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, op_type
            if rtol:
                np.testing.assert_allclose(g, w, rtol=0, atol=rtol * max(1.0, float(np.abs(w).max())))
            elif g.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(g, w, err_msg=op_type)
    return got[0]


@pytest.fixture(autouse=True)
def kiln_runs_on_xla(monkeypatch, request):
    module = MODULE_OF.get(request.function)
    if module is None:
        return
    if hasattr(module, "delegated"):
        monkeypatch.setattr(module, "delegated", xla_delegated)
    if hasattr(module, "check"):
        monkeypatch.setattr(module, "check", xla_check)


def test_sweeps_were_collected():
    assert len(SWEEPS) > 40
