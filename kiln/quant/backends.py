"""What runs the float model while calibrating: TF's or LiteRT's kernels where they are
installed, kiln's Interpreter otherwise.

TF's calibrator runs the float model on the LiteRT copy bundled with TensorFlow
(tf.lite.Interpreter, its builtin kernels without XNNPACK), and a scale is the calibrated
range over 255 or 32767: a float sum rounded differently moves a 16x8 scale by an ulp
(issue #22: kiln's NumPy conv, and ai-edge-litert's builtin FULLY_CONNECTED, which is
compiled differently from TF's copy, each round one sum of a trained digits CNN apart). So
calibration runs on TensorFlow's bundled interpreter when TensorFlow is already loaded (the
converter, or any program that imported it: its ranges, and so its scales, are TF's to the
bit), else on ai-edge-litert's kernels, else on kiln's interpreter; all three are also many
times faster than kiln's interpreter was alone. LiteRT runs some ops in place, which is how
TF's calibrator ends up logging a tensor after its consumer overwrote it; here the model is
written anew (kiln's writer) with every tracked tensor among its outputs, so nothing runs in
place and every range is the tensor's own. Neither TensorFlow nor ai-edge-litert is
imported unless calibration runs: kiln's runtime needs neither.

A runner takes a batch of samples (arrays in input order, their batch dimension first) and
returns each tracked tensor's value; `same_as_alone` decides whether samples may share a
run (a batch must give its first sample's values exactly as that sample alone does).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..ir import Model, Tensor

#: Bytes of tracked activations one batch may hold (batch size = this / bytes per sample).
BATCH_BYTES = 256 << 20
MAX_BATCH = 32


def invoke_fresh(runner, feeds: Sequence[np.ndarray]) -> None:
    """One run of ``runner.interp`` (any tf.lite-style interpreter) on ``feeds``, in the order of
    ``runner.inputs``: the inputs are resized and the tensors allocated only when the feeds'
    shapes change (``runner.shapes``), and variables start from their initial values, so every
    sample is a sequence of its own."""
    shapes = [np.shape(a) for a in feeds]
    if shapes != runner.shapes:
        runner.shapes = None            # until the allocation succeeds
        for index, shape in zip(runner.inputs, shapes):
            runner.interp.resize_tensor_input(index, shape, strict=False)
        runner.interp.allocate_tensors()
        runner.shapes = shapes
    runner.interp.reset_all_variables()
    for index, value in zip(runner.inputs, feeds):
        runner.interp.set_tensor(index, value)
    runner.interp.invoke()


class KilnRunner:
    """kiln's Interpreter with every tensor kept (the fallback)."""

    name = "kiln"

    def __init__(self, model: Model, tracked: Sequence[Tensor]):
        from ..runtime import Interpreter

        self.interp = Interpreter(model_content=model, experimental_preserve_all_tensors=True)
        position = {id(t): i for i, t in enumerate(model.main.tensors)}
        self.indices = [position[id(t)] for t in tracked]
        self.inputs = [position[id(t)] for t in model.main.inputs]
        self.shapes: list | None = None

    def run(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        invoke_fresh(self, feeds)
        return [self.interp.get_tensor(i) for i in self.indices]


class LiteRTRunner:
    """LiteRT's builtin kernels (no XNNPACK, as TF's calibrator) on a copy of the model whose
    outputs are every tracked tensor: TensorFlow's bundled copy (``flavour`` "tensorflow")
    or ai-edge-litert's ("litert")."""

    def __init__(self, model: Model, tracked: Sequence[Tensor], flavour: str = "litert"):
        if flavour == "tensorflow":
            import warnings

            import tensorflow as tf

            Interpreter, kind = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
            warnings.filterwarnings("ignore", message=r"\s*Warning: tf.lite.Interpreter is deprecated")
        else:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType as kind
        from ..format import write_model

        self.name = flavour
        sg = model.main
        saved_outputs, saved_metadata = list(sg.outputs), dict(model.metadata)
        inputs = {id(t) for t in sg.inputs}
        extra = [t for t in tracked if id(t) not in inputs and not any(t is o for o in saved_outputs)]
        try:
            sg.outputs[:] = saved_outputs + extra
            data = write_model(model)
        finally:
            sg.outputs[:] = saved_outputs
            model.metadata.clear()
            model.metadata.update(saved_metadata)
        self.interp = Interpreter(model_content=data, num_threads=min(4, os.cpu_count() or 1),
                                  experimental_op_resolver_type=kind.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        outputs = [d["index"] for d in self.interp.get_output_details()]
        where = {id(t): ("output", outputs[k]) for k, t in enumerate(saved_outputs + extra)}
        self.sources = [where.get(id(t)) or ("input", next(k for k, x in enumerate(sg.inputs) if x is t))
                        for t in tracked]
        self.inputs = [d["index"] for d in self.interp.get_input_details()]
        self.shapes: list | None = None
        self.interp.allocate_tensors()

    def run(self, feeds: list[np.ndarray]) -> list[np.ndarray]:
        invoke_fresh(self, feeds)
        return [feeds[i] if kind == "input" else self.interp.get_tensor(i) for kind, i in self.sources]


BACKENDS = ("auto", "tensorflow", "litert", "kiln")


def runner_for(model: Model, tracked: Sequence[Tensor], backend: str = "auto"):
    """The runner for ``backend``: "auto" takes TensorFlow's interpreter if TensorFlow is
    loaded already, else ai-edge-litert's, else kiln's — the first that can run ``model``
    (custom ops, for one, only kiln's can); a named backend's errors pass through."""
    import sys

    if backend not in BACKENDS:
        raise ValueError(f"calibration backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "kiln":
        return KilnRunner(model, tracked)
    if backend != "auto":
        return LiteRTRunner(model, tracked, backend)
    for flavour in (("tensorflow",) if "tensorflow" in sys.modules else ()) + ("litert",):
        try:
            return LiteRTRunner(model, tracked, flavour)
        except Exception:   # not installed, or it cannot run this model
            continue
    return KilnRunner(model, tracked)


def batch_size(tracked: Sequence[Tensor]) -> int:
    """How many samples one run takes: the tracked activations of a batch within BATCH_BYTES."""
    per_sample = sum(4 * max(1, int(np.prod([d for d in t.shape if d > 0] or [1]))) for t in tracked)
    return int(max(1, min(MAX_BATCH, BATCH_BYTES // max(per_sample, 1))))


def stack(samples: list[list[np.ndarray]]) -> list[np.ndarray] | None:
    """Samples as one batch along their leading dimension (None: they cannot share a run —
    a leading dimension other than 1, or shapes that differ)."""
    first = samples[0]
    if any(a.ndim == 0 or a.shape[0] != 1 for a in first):
        return None
    if any([a.shape for a in s] != [a.shape for a in first] for s in samples[1:]):
        return None
    return [np.concatenate([s[k] for s in samples]) for k in range(len(first))]


def same_as_alone(batched: list[np.ndarray], alone: list[np.ndarray], rows: int) -> bool:
    """Whether a batched run's values are the first sample's, row 0, bit for bit: every
    tracked tensor either carries the batch (leading dimension ``rows`` where the sample's
    was 1) or does not depend on it (equal shapes and values)."""
    for b, a in zip(batched, alone):
        if b.shape == a.shape and rows != 1:
            if not np.array_equal(b, a, equal_nan=True):
                return False
        elif a.ndim and a.shape[0] == 1 and b.shape == (rows,) + a.shape[1:]:
            if not np.array_equal(b[:1], a, equal_nan=True):
                return False
        else:
            return False
    return True
