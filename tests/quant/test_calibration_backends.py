"""Calibration backends (kiln.quant.backends): TF's bundled LiteRT, ai-edge-litert and kiln's
Interpreter give the same per-tensor ranges (to float32 rounding) on a model written with every
tracked tensor as an output; batched runs are taken only where they reproduce each sample's
own values; a model LiteRT cannot run calibrates on kiln's Interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Model, Operator
from kiln.quant import backends
from kiln.quant.calibrate import calibrate
from kiln.schema import Activation, DType

RNG = np.random.default_rng(6)


def _mlp(reshape_to: tuple | None = None) -> Model:
    """x [b, 6] -> FC(8, relu) -> (RESHAPE to a fixed shape) -> FC(3) -> softmax."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 6), shape_signature=(-1, 6))
    h = sg.add_tensor("h", DType.FLOAT32, (1, 8), shape_signature=(-1, 8))
    sg.inputs.append(x)
    sg.add_operator(Operator("FULLY_CONNECTED", options={"fused_activation_function": Activation.RELU}),
                    [x, sg.add_constant("w0", RNG.standard_normal((8, 6)).astype(np.float32)), None], [h])
    if reshape_to is not None:
        r = sg.add_tensor("r", DType.FLOAT32, reshape_to)
        sg.add_operator(Operator("RESHAPE"), [h, sg.add_constant("shape", np.int32(reshape_to))], [r])
        h = r
    y = sg.add_tensor("y", DType.FLOAT32, (1, 3), shape_signature=(-1, 3))
    p = sg.add_tensor("p", DType.FLOAT32, (1, 3), shape_signature=(-1, 3))
    sg.add_operator(Operator("FULLY_CONNECTED"),
                    [h, sg.add_constant("w1", RNG.standard_normal((3, 8)).astype(np.float32)), None], [y])
    sg.add_operator(Operator("SOFTMAX", options={"beta": 1.0}), [y], [p])
    sg.outputs.append(p)
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    return kiln.read_model(kiln.write_model(model))


def _samples(n=12):
    return [[RNG.standard_normal((1, 6)).astype(np.float32)] for _ in range(n)]


@pytest.mark.parametrize("backend", ["tensorflow", "litert", "kiln"])
def test_backends_agree_on_ranges(backend):
    if backend == "tensorflow":
        pytest.importorskip("tensorflow")
    model, samples = _mlp(), _samples()
    want = calibrate(model, samples, progress=False, backend="kiln")
    got = calibrate(model, samples, progress=False, backend=backend)
    assert set(got) == set(want)
    for key, r in want.items():
        assert got[key].min == pytest.approx(r.min, rel=1e-6, abs=1e-6)
        assert got[key].max == pytest.approx(r.max, rel=1e-6, abs=1e-6)


def test_batches_only_where_they_reproduce_each_sample(monkeypatch):
    runs = []
    real = backends.LiteRTRunner.run

    def counting(self, feeds):
        runs.append(feeds[0].shape[0])
        return real(self, feeds)

    monkeypatch.setattr(backends.LiteRTRunner, "run", counting)
    samples, model = _samples(12), _mlp()
    by_batch = calibrate(model, samples, progress=False, backend="litert")
    assert runs[:2] == [1, 12]            # the first sample alone, then the batch it is checked against
    assert len(runs) in (2, 13)           # the batch taken, or the samples one by one after the check
    singly = [backends.LiteRTRunner(model, [model.main.outputs[0]]).run(s)[0] for s in samples]
    top = by_batch[id(model.main.outputs[0])]
    assert top.max == max(float(v.max()) for v in singly) and top.min == min(float(v.min()) for v in singly)
    runs.clear()
    calibrate(_mlp(reshape_to=(1, 8)), samples, progress=False, backend="litert")   # a fixed-shape RESHAPE
    assert set(runs[2:]) == {1}          # the batch failed to allocate: one sample at a time after it


def test_same_as_alone_checks_every_tensor():
    alone = [np.ones((1, 3), np.float32), np.full((2,), 5.0, np.float32)]
    batched = [np.ones((4, 3), np.float32), np.full((2,), 5.0, np.float32)]
    assert backends.same_as_alone(batched, alone, 4)
    batched[0][0, 1] = np.nextafter(np.float32(1), np.float32(2))
    assert not backends.same_as_alone(batched, alone, 4)
    assert not backends.same_as_alone([np.ones((4, 3), np.float32), np.full((2,), 6.0, np.float32)], alone, 4)


def test_a_model_litert_cannot_run_calibrates_on_kiln():
    """A Python custom op: only kiln's Interpreter runs it."""
    model = _mlp()
    sg = model.main
    op = next(o for o in sg.operators if o.op_type == "SOFTMAX")
    op.op_type, op.custom_code = "CUSTOM", "NoSuchOpInLiteRT"
    runner = backends.runner_for(model, [t for t in sg.tensors if t.producer is not None], "auto")
    assert isinstance(runner, backends.KilnRunner)
