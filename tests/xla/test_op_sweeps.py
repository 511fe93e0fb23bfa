"""Every lowering over the reference kernels' own parameter sweeps, against LiteRT and the
reference kernel.

The tests of tests/ops that compare a one-op model in kiln with LiteRT (through
tests.harness.check_op / run_kiln) are collected here a second time, with kiln's side run
under an XlaDelegate that must claim the op: a sweep case whose node stays on the reference
kernel fails, unless its op has no lowering or needs values XLA cannot have at compile time
(then it is skipped with that reason). Each XLA result is also held to the reference
kernel's on the same inputs.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

pytest.importorskip("jax")

#: `make test` runs each function's first case and one in 5; the whole sweep runs over both lanes (conftest.py).
FAST_LANE_SHARE = 5

import tests.ops  # noqa: E402
from kiln.runtime import Interpreter  # noqa: E402
from kiln.xla import XlaDelegate, get_lowering  # noqa: E402
from kiln.xla.table import ALL_STATIC  # noqa: E402
from tests import harness  # noqa: E402

#: Modules with no value comparisons to re-run.
SKIPPED_MODULES = {"test_shape_rules"}


def _sweep_tests():
    found = {}
    for info in pkgutil.iter_modules(tests.ops.__path__):
        if info.name in SKIPPED_MODULES:
            continue
        module = importlib.import_module(f"tests.ops.{info.name}")
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            source = inspect.getsource(fn)
            # Cases that expect an error test the reference kernel's checks, not values.
            if ("check_op(" in source or "run_kiln(" in source or "_run_both(" in source) \
                    and "raises" not in source:
                found[f"test_{info.name[5:]}__{name[5:]}"] = (module, fn)
    return found


SWEEPS = _sweep_tests()
MODULE_OF = {fn: module for module, fn in SWEEPS.values()}
for _name, (_module, _fn) in SWEEPS.items():
    globals()[_name] = _fn


def _close(a, e, what):
    a, e = np.asarray(a), np.asarray(e)
    if e.dtype.kind in "fc":
        harness.assert_close(a, e, rtol=1e-4, atol=1e-5, what=what)
    else:
        harness.assert_close(a, e, what=what)


def _require_claimed(delegate):
    for (index, op_name, _), reason in delegate.rejected.items():
        low = get_lowering(op_name)
        if low is None:
            pytest.skip(f"{op_name} has no XLA lowering")
        if low.static == ALL_STATIC or "only known at run time" in reason or "is not lowered" in reason \
                or "quirk" in reason:
            pytest.skip(f"node {index} ({op_name}) is outside what the lowering covers: {reason}")
        pytest.fail(f"XlaDelegate refused node {index} ({op_name}): {reason}")
    assert delegate.claimed, "the XLA delegate claimed nothing"


class XlaInterpreter(Interpreter):
    """kiln's Interpreter with an XlaDelegate that must claim the model's node."""

    def __init__(self, *args, **kwargs):
        self.xla = XlaDelegate()
        super().__init__(*args, experimental_delegates=[self.xla], **kwargs)

    def allocate_tensors(self):
        super().allocate_tensors()
        _require_claimed(self.xla)


@pytest.fixture(autouse=True)
def kiln_runs_on_xla(monkeypatch, request):
    """Route the harness's kiln runs through an XlaDelegate that must claim every node."""

    def run_kiln(model, inputs, **kwargs):
        delegate = XlaDelegate()
        actual = harness.feed(Interpreter(model_content=model, experimental_delegates=[delegate], **kwargs),
                              inputs)
        _require_claimed(delegate)
        reference = harness.feed(Interpreter(model_content=model, **kwargs), inputs)
        for k, (a, e) in enumerate(zip(actual, reference)):
            _close(a, e, f"XLA vs reference kernel, output {k}")
        return actual

    monkeypatch.setattr(harness, "run_kiln", run_kiln)
    module = MODULE_OF.get(request.function)
    if module is not None and hasattr(module, "run_kiln"):
        monkeypatch.setattr(module, "run_kiln", run_kiln)
    if module is not None and getattr(module, "Interpreter", None) is Interpreter:
        monkeypatch.setattr(module, "Interpreter", XlaInterpreter)


def test_sweeps_were_collected():
    assert len(SWEEPS) > 100
