"""Shared helpers for the fusion tests: a model around one hand-built composite call, run in
LiteRT (the oracle) and in kiln's Interpreter."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from kiln.format import write_model
from kiln.fusion.registry import CompositeCall, fuse_call
from kiln.ir import Model
from kiln.runtime import Interpreter as KilnInterpreter
from kiln.schema import DType
from tests.harness import Const, assert_close, feed


@dataclass
class In:
    """A run-time argument of the composite: a model input. ``dynamic`` dims become -1."""

    value: np.ndarray
    dynamic: tuple[int, ...] = ()

    def __post_init__(self):
        self.value = np.asarray(self.value)


@dataclass
class Built:
    model: bytes
    outputs: list            # fused output tensors (IR), one per function result
    feeds: list              # values for the model inputs, in order
    notes: list


def composite_model(name: str, attrs: dict, args: Sequence, n_results: int, *,
                    label: str = "", keep: Sequence[int] | None = None,
                    out_shapes: Sequence[tuple] | None = None) -> Built:
    """Hand a CompositeCall over ``args`` (In = model input, Const = frozen constant) to the
    fusion registry, as the importer would, and write a model whose outputs are the results
    ``keep`` (default: all, constants dropped)."""
    model = Model()
    sg = model.add_subgraph("main")
    inputs, feeds = [], []
    for k, a in enumerate(args):
        if isinstance(a, Const):
            inputs.append(sg.add_constant(f"arg{k}", a.value))
        else:
            sig = tuple(-1 if d in a.dynamic else s for d, s in enumerate(a.value.shape))
            t = sg.add_tensor(f"arg{k}", DType.from_numpy(a.value.dtype), a.value.shape,
                              shape_signature=sig)
            inputs.append(t)
            sg.inputs.append(t)
            feeds.append(a.value)
    call = CompositeCall(name, dict(attrs), inputs, [np.float32] * n_results,
                         list(out_shapes or [()] * n_results), sg, label=label)
    outs = fuse_call(call)
    assert outs is not None and len(outs) == n_results
    chosen = []
    for k in (range(n_results) if keep is None else keep):
        t = outs[k]
        if not t.is_constant:
            chosen.append(t)
    sg.outputs = chosen
    _dead_code(sg)
    return Built(write_model(model), outs, feeds, call.notes)


def _dead_code(sg) -> None:
    """Drop ops nobody reads (the converter's DCE does this after import)."""
    changed = True
    while changed:
        changed = False
        for op in reversed(list(sg.operators)):
            if all(t is None or (not t.users and t not in sg.outputs) for t in op.outputs):
                sg.remove_operator(op)
                changed = True
    sg.remove_unused_tensors()


def litert(model: bytes):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model)


def invoke(interp, feeds: Sequence[np.ndarray], allocate: bool = True) -> list[np.ndarray]:
    """Feed, invoke, read every output (resizing inputs to the feeds' shapes when needed)."""
    return feed(interp, feeds, allocate)


def op_names(model: bytes) -> list[str]:
    interp = litert(model)
    interp.allocate_tensors()
    return [d["op_name"] for d in interp._get_ops_details()]  # noqa: SLF001


def check_both(model: bytes, feeds: Sequence[np.ndarray], expected: Sequence[np.ndarray], *,
               rtol: float = 1e-5, atol: float = 1e-5, invokes: int = 2) -> None:
    """LiteRT and kiln both reproduce ``expected`` — on every one of ``invokes`` calls (a
    non-stateful LSTM must not carry state from one call into the next)."""
    for name, interp in (("litert", litert(model)), ("kiln", KilnInterpreter(model_content=model))):
        for n in range(invokes):
            got = invoke(interp, feeds, allocate=n == 0)
            assert len(got) == len(expected), f"{name}: {len(got)} outputs, expected {len(expected)}"
            for k, (g, e) in enumerate(zip(got, expected)):
                assert_close(g, np.asarray(e, np.float32), rtol=rtol, atol=atol,
                             what=f"{name} invoke {n} output {k}")


#: Batch, time steps and features of the sequence models the conversion tests build.
B, T, I = 2, 6, 3


def sequence_input(shape=(B, T, I), seed=1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def randomized(model, seed=0):
    """The Keras model with uniform(-0.6, 0.6) weights (initial weights make gates too tame)."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in model.get_weights()])
    return model
