"""Test harness: one-op models run side by side in ai-edge-litert and kiln's Interpreter.

`check_op` builds a single-operator .tflite with kiln's own writer, runs it in the official
LiteRT interpreter (the oracle) and in kiln, and asserts both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kiln import ops
from kiln.delegates import LiteRtDelegate
from kiln.format import write_model
from kiln.ir import Model, QuantParams
from kiln.ops.record import KernelCall
from kiln.runtime import Interpreter
from kiln.schema import DType


@dataclass
class Const:
    """Marks an operand that is a constant tensor in the model (weights, shapes, axes)."""

    value: np.ndarray
    quant: QuantParams | None = None

    def __post_init__(self):
        self.value = np.asarray(self.value)


@dataclass
class Var:
    """Marks an operand that is a variable tensor (e.g. sequence-LSTM state), initial value given."""

    value: np.ndarray

    def __post_init__(self):
        self.value = np.asarray(self.value)


OMITTED = None  # an optional operand left out (-1 in the file)


def _kernel_outputs(op_type, inputs, options, out_dtypes):
    """Run kiln's kernel directly to learn output shapes/dtypes for the model file."""
    record = ops.require(op_type)
    model = Model()
    sg = model.add_subgraph("probe")
    from kiln.ir import Operator

    op = Operator(op_type, options=options or {})
    ins = []
    for k, x in enumerate(inputs):
        if x is None:
            ins.append(None)
        else:
            v = x.value if isinstance(x, (Const, Var)) else np.asarray(x)
            ins.append(sg.add_constant(f"in{k}", v))
    sg.add_operator(op, ins, [])
    call = KernelCall(record.make_options(options), op, list(out_dtypes or []))
    args = [None if x is None else (x.value if isinstance(x, (Const, Var)) else np.asarray(x)) for x in inputs]
    if not out_dtypes:
        call.out_dtypes = [np.dtype(np.float32)] * 8
    result = record.kernel(call, *args)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if record.state_operands:  # new state values follow the outputs; unused outputs are None
        result = [r for r in result[:len(result) - len(record.state_operands)] if r is not None]
    return [np.asarray(r) for r in result]


def single_op_model(op_type: str, inputs: Sequence, *, options: dict | None = None, version: int | None = None,
                    out_dtypes: Sequence | None = None, out_shapes: Sequence | None = None,
                    custom_code: str | None = None, custom_options: bytes | None = None) -> bytes:
    """A .tflite holding one operator; non-Const, non-None operands become model inputs."""
    model = Model()
    sg = model.add_subgraph("main")
    ins = []
    for k, x in enumerate(inputs):
        if x is None:
            ins.append(None)
        elif isinstance(x, Const):
            ins.append(sg.add_constant(f"const{k}", x.value, quantization=x.quant))
        elif isinstance(x, Var):
            t = sg.add_tensor(f"var{k}", DType.from_numpy(x.value.dtype), x.value.shape, is_variable=True)
            if np.any(x.value):
                t.data = np.ascontiguousarray(x.value)
            ins.append(t)
        else:
            arr = np.asarray(x)
            t = sg.add_tensor(f"input{k}", DType.from_numpy(arr.dtype), arr.shape)
            sg.inputs.append(t)
            ins.append(t)
    if out_dtypes is None or out_shapes is None:
        probe = _kernel_outputs(op_type, inputs, options, out_dtypes)
        out_dtypes = out_dtypes or [p.dtype for p in probe]
        out_shapes = out_shapes or [p.shape for p in probe]
    outs = [sg.add_tensor(f"output{k}", DType.from_numpy(np.dtype(d)), s)
            for k, (d, s) in enumerate(zip(out_dtypes, out_shapes))]
    sg.outputs = outs
    from kiln.ir import Operator

    op = Operator(op_type, options=options or {}, custom_code=custom_code, custom_options=custom_options)
    sg.add_operator(op, ins, outs)
    if version is None:
        record = ops.get(op_type)
        version = record.version(op) if record is not None else 1
    op.version = version
    return write_model(model)


def feed(interp, inputs, allocate: bool = True) -> list[np.ndarray]:
    """Feed, invoke, read every output; with ``allocate``, resize inputs to the feeds' shapes
    and allocate first (any tf.lite-style interpreter: kiln's or LiteRT's)."""
    if allocate:
        for d, x in zip(interp.get_input_details(), inputs):
            if tuple(d["shape"]) != np.shape(x):
                interp.resize_tensor_input(d["index"], np.shape(x))
        interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], np.asarray(x))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def run_api(interp, inputs) -> list[np.ndarray]:
    """allocate / set_tensor / invoke / get_tensor, the way tf.lite users drive a model (no
    resizing: a feed of the wrong shape meets the interpreter's own check)."""
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def run_litert(model: bytes, inputs: Sequence[np.ndarray], builtin_kernels: bool = False) -> list[np.ndarray]:
    """Run in ai-edge-litert; ``builtin_kernels`` switches XNNPACK off (LiteRT's reference path)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRTInterpreter, OpResolverType

    kind = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels else OpResolverType.AUTO
    return feed(LiteRTInterpreter(model_content=model, experimental_op_resolver_type=kind), inputs)


def own_kernels() -> dict:
    """Interpreter arguments that run kiln's own kernels, not LiteRT's: the default delegates
    as without ai-edge-litert (the NumPy delegate, over the reference kernels), or the
    reference kernels alone when the session's default has no delegates
    (``--kiln-backend=ref``)."""
    from kiln.delegates import NumpyDelegate
    from kiln.runtime import OpResolverType, delegate

    if not delegate._DEFAULT_DELEGATES:
        return {"experimental_op_resolver_type": OpResolverType.BUILTIN_REF}
    return {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
            "experimental_delegates": [NumpyDelegate()]}


def run_kiln(model: bytes, inputs: Sequence[np.ndarray], **kwargs) -> list[np.ndarray]:
    """Run in kiln's Interpreter: on kiln's own kernels (`own_kernels`) unless ``kwargs`` pick
    the op resolver type or delegates."""
    if "experimental_op_resolver_type" not in kwargs and "experimental_delegates" not in kwargs:
        kwargs = {**own_kernels(), **kwargs}
    return feed(Interpreter(model_content=model, **kwargs), inputs)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, what="output"):
    """Equal within rtol relative to the output's scale (max |expected|), plus atol."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.dtype.kind in "fc":
        finite_abs = np.abs(expected[np.isfinite(expected)])
        scale = float(np.max(finite_abs)) if finite_abs.size else 0.0
        nan_ok = np.array_equal(np.isnan(actual), np.isnan(expected))
        assert nan_ok, f"{what}: NaN positions differ"
        assert np.array_equal(np.isinf(actual), np.isinf(expected)), f"{what}: inf positions differ"
        finite = np.isfinite(expected)
        err = float(np.max(np.abs(actual[finite].astype(np.float64) - expected[finite]), initial=0.0))
        assert err <= atol + rtol * scale, f"{what}: max abs error {err} > {atol} + {rtol} * {scale}"
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def check_op(op_type: str, inputs: Sequence, *, options: dict | None = None, version: int | None = None,
             out_dtypes=None, out_shapes=None, rtol: float = 1e-5, atol: float = 1e-6,
             builtin_kernels: bool = False) -> list[np.ndarray]:
    """Run a one-op model in LiteRT and in kiln, on kiln's own kernels and through the LiteRT
    delegate (the model kiln writes for LiteRT, or kiln's kernels for what LiteRT gives back);
    assert they all agree; return the outputs of kiln's own kernels."""
    model = single_op_model(op_type, inputs, options=options, version=version,
                            out_dtypes=out_dtypes, out_shapes=out_shapes)
    feeds = [np.asarray(x) for x in inputs if x is not None and not isinstance(x, (Const, Var))]
    expected = run_litert(model, feeds, builtin_kernels=builtin_kernels)
    actual = run_kiln(model, feeds)
    via_litert = feed(Interpreter(model_content=model, experimental_delegates=[LiteRtDelegate()]), feeds)
    assert len(actual) == len(expected) == len(via_litert)
    for k, (a, d, e) in enumerate(zip(actual, via_litert, expected)):
        assert_close(a, e, rtol=rtol, atol=atol, what=f"{op_type} output {k}")
        assert_close(d, e, rtol=rtol, atol=atol, what=f"{op_type} output {k} (LiteRT delegate)")
    return actual
