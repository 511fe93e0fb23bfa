"""How the quantization debugger runs models: runners that keep every tensor, one op cut
out into a model of its own, and (de)quantization of activations.

A runner is a callable taking .tflite bytes and returning a session; ``session(feeds,
wanted)`` runs one sample (arrays in model-input order) and returns ``{tensor index: array}``
for the ``wanted`` main-subgraph tensors it could read. ``"kiln"`` uses kiln's Interpreter, ``"litert"``
LiteRT's reference kernels (``BUILTIN_REF``, the ones kiln's integer kernels are bit-exact
with), both with all intermediates preserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ... import ops, runtime
from ...errors import KilnError
from ...format import write_model
from ...ir import Model, Operator, QuantParams, Tensor
from ...kernels.fixedpoint import round_half_away
from ...runtime import OpResolverType
from ...schema import DType
from ..backends import invoke_fresh

Session = Callable[[Sequence[np.ndarray], Iterable[int]], dict]
Runner = Callable[[bytes], Session]

class _InterpreterSession:
    """One model in an interpreter of LiteRT's Python API, inputs resized as samples need."""

    def __init__(self, interp, label: str):
        self.interp, self.label = interp, label
        self.inputs = [d["index"] for d in interp.get_input_details()]
        self.shapes: list[tuple] | None = None

    def __call__(self, feeds: Sequence[np.ndarray], wanted: Iterable[int]) -> dict[int, np.ndarray]:
        """Tensor values after one run; a tensor the interpreter holds no data for (LiteRT:
        an unused WHILE output) is left out."""
        try:
            invoke_fresh(self, feeds)
        except KilnError:
            raise
        except (RuntimeError, ValueError) as exc:
            raise KilnError(f"{self.label} failed to run the model: {exc}") from exc
        values = {}
        for i in wanted:
            try:
                values[i] = self.interp.get_tensor(i)
            except ValueError:   # LiteRT: "Tensor data is null"
                continue
        return values


def _preserving_runner(backend: str, label: str, resolver=None) -> Runner:
    """A runner on `kiln.runtime.open`'s interpreter for ``backend`` (every intermediate kept)."""
    def runner(model: bytes) -> Session:
        interp = runtime.open(model, backend, op_resolver_type=resolver, preserve_all_tensors=True).make_interpreter()
        return _InterpreterSession(interp, label)

    runner.__doc__ = f"{label} with every intermediate tensor preserved."
    return runner


kiln_runner = _preserving_runner("kiln", "kiln's Interpreter")
#: LiteRT's reference kernels: the ones kiln's integer kernels are bit-exact with.
litert_runner = _preserving_runner("litert", "LiteRT (BUILTIN_REF)", OpResolverType.BUILTIN_REF)


RUNNERS: dict[str, Runner] = {"kiln": kiln_runner, "litert": litert_runner}


def resolve_runner(runner) -> Runner:
    """A runner from its name or a callable (see the module docstring)."""
    if callable(runner):
        return runner
    if runner in RUNNERS:
        return RUNNERS[runner]
    raise KilnError(f"QuantizationDebugger: unknown runner {runner!r}; use one of {sorted(RUNNERS)} "
                    "or a callable taking .tflite bytes")


# -- (de)quantization ---------------------------------------------------------------------------
def is_quantized(t: Tensor) -> bool:
    """An integer activation with affine parameters (int8, uint8, int16)."""
    return t.dtype in (DType.INT8, DType.UINT8, DType.INT16) and t.quantization is not None \
        and t.quantization.scale.size > 0


def _broadcast(values: np.ndarray, qp: QuantParams, rank: int) -> np.ndarray:
    if values.size == 1 or rank == 0:
        return values.reshape(()) if values.size == 1 else values
    shape = [1] * rank
    shape[qp.quantized_dimension] = values.size
    return values.reshape(shape)


def real_values(t: Tensor, value: np.ndarray) -> np.ndarray:
    """The real values of ``t``'s stored ``value`` (float64); float tensors as they are."""
    if not is_quantized(t):
        return np.asarray(value, np.float64)
    qp = t.quantization
    scale = _broadcast(qp.scale.astype(np.float64), qp, value.ndim)
    zero = _broadcast(qp.zero_point.astype(np.float64), qp, value.ndim)
    return (value.astype(np.float64) - zero) * scale


def stored_values(t: Tensor, real: np.ndarray) -> np.ndarray:
    """``real`` stored as ``t`` stores it: LiteRT's QUANTIZE (round half away, clamp)."""
    if not is_quantized(t):
        return np.asarray(real).astype(t.dtype.numpy)
    qp = t.quantization
    info = np.iinfo(t.dtype.numpy)
    scale = _broadcast(qp.scale.astype(np.float32), qp, np.ndim(real))
    zero = _broadcast(qp.zero_point, qp, np.ndim(real))
    q = round_half_away(np.asarray(real, np.float32) / scale) + zero
    return np.clip(q, info.min, info.max).astype(t.dtype.numpy)


# -- one op on its own ---------------------------------------------------------------------------
@dataclass
class Isolated:
    """One op as a model: ``fed[k]`` is the position in the op's inputs of model input k;
    ``outputs[k]`` the tensor index of the op's output k (None where it has none)."""

    model: bytes
    fed: list[int]
    outputs: list[int | None]


def isolate(op: Operator) -> Isolated | None:
    """``op`` alone in a model: its non-constant inputs become the model's inputs, constants
    and variables are copied. None for ops that call other subgraphs."""
    if ops.subgraph_fields(op) or any("subgraph" in k for k in op.options):   # it calls other subgraphs
        return None
    model = Model("kiln quantization debugger: one op")
    sg = model.add_subgraph("op")
    inputs, fed, copies = [], [], {}
    for i, t in enumerate(op.inputs):
        if t is None:
            inputs.append(None)
            continue
        if id(t) not in copies:
            copies[id(t)] = sg.add_tensor(t.detached())
            if t.data is None and not t.is_variable:
                sg.inputs.append(copies[id(t)])
                fed.append(i)
        inputs.append(copies[id(t)])
    outputs = [None if t is None else sg.add_tensor(t.detached()) for t in op.outputs]
    clone = Operator(op.op_type, version=op.version, options=dict(op.options), custom_code=op.custom_code,
                     custom_options=op.custom_options)
    clone.options_table, clone.custom_options_format = op.options_table, op.custom_options_format
    sg.add_operator(clone, inputs, outputs)
    clone.intermediates = [sg.add_tensor(t.detached()) for t in op.intermediates]
    sg.outputs.extend(t for t in outputs if t is not None)
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    return Isolated(write_model(model), fed, [None if t is None else index[id(t)] for t in outputs])
