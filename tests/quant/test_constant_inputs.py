"""Every op kind the integer quantizer handles, with each real-valued operand a constant in
turn (and all of them at once): quantizing never raises anything but a `KilnError`, and what
it writes runs in kiln's Interpreter and in LiteRT.

A constant where the quantizer expects an activation is common in models nobody wrote by
hand — a Keras Embedding's table is GATHER's constant input 0, an attention mask is ADD's
constant, a PADV2 pad value, a folded bias — and used to crash the rewrite with an
AttributeError (issue #22). Constants holding zeros only, or an infinity (a -inf mask), ride
along: they must be quantized or kept float, never crash.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.errors import KilnError
from kiln.ir import Model, Operator
from kiln.ops.traits import OutputScale
from kiln.schema import DType, Padding
from tests.harness import _kernel_outputs

RNG = np.random.default_rng(22)


class F:
    """A real-valued operand: a model input unless the case makes it a constant."""

    def __init__(self, *shape, positive: bool = False):
        self.shape = shape
        self.positive = positive

    def draw(self, rng) -> np.ndarray:
        x = rng.standard_normal(self.shape).astype(np.float32)
        return np.abs(x) + np.float32(0.1) if self.positive else x


def i32(v) -> np.ndarray:
    return np.asarray(v, np.int32)


class Index:
    """An integer operand fed as a model input (GATHER's indices)."""

    def __init__(self, value):
        self.value = i32(value)


STRIDE = dict(stride_w=1, stride_h=1)
POOL = dict(padding=Padding.VALID, stride_w=2, stride_h=2, filter_width=2, filter_height=2)
WEIGHTS = RNG.standard_normal((3, 2, 2, 2)).astype(np.float32)

#: op type -> (operands, options): F operands are real-valued, arrays are constants.
CASES = {
    "ABS": ([F(2, 3)], {}),
    "ADD": ([F(2, 3), F(2, 3)], {}),
    "SUB": ([F(2, 3), F(2, 3)], {}),
    "MUL": ([F(2, 3), F(1, 3)], {}),
    "SQUARED_DIFFERENCE": ([F(2, 3), F(2, 3)], {}),
    "MAXIMUM": ([F(2, 3), F(2, 3)], {}),
    "MINIMUM": ([F(2, 3), F(2, 3)], {}),
    "AVERAGE_POOL_2D": ([F(1, 4, 4, 2)], POOL),
    "MAX_POOL_2D": ([F(1, 4, 4, 2)], POOL),
    "BATCH_MATMUL": ([F(2, 3), F(3, 4)], {}),
    "BATCH_TO_SPACE_ND": ([F(4, 2, 2, 1), i32([2, 2]), i32([[0, 0], [0, 0]])], {}),
    "SPACE_TO_BATCH_ND": ([F(1, 4, 4, 1), i32([2, 2]), i32([[0, 0], [0, 0]])], {}),
    "BROADCAST_TO": ([F(1, 3), i32([2, 3])], {}),
    "CONCATENATION": ([F(2, 3), F(2, 3)], {"axis": 0}),
    "PACK": ([F(2, 3), F(2, 3)], {"values_count": 2, "axis": 0}),
    "CONV_2D": ([F(1, 4, 4, 2), WEIGHTS, np.float32([0.1, -0.2, 0.3])], {"padding": Padding.VALID, **STRIDE}),
    "DEPTHWISE_CONV_2D": ([F(1, 4, 4, 2), WEIGHTS[:1], np.float32([0.1, -0.2])],
                          {"padding": Padding.SAME, "depth_multiplier": 1, **STRIDE}),
    "TRANSPOSE_CONV": ([i32([1, 4, 4, 3]), WEIGHTS, F(1, 4, 4, 2)], {"padding": Padding.SAME, **STRIDE}),
    "FULLY_CONNECTED": ([F(2, 3), WEIGHTS.reshape(4, 6)[:, :3].copy(), np.float32([1, 2, 3, 4])], {}),
    "DEPTH_TO_SPACE": ([F(1, 2, 2, 4)], {"block_size": 2}),
    "SPACE_TO_DEPTH": ([F(1, 4, 4, 1)], {"block_size": 2}),
    "ELU": ([F(2, 3)], {}),
    "EXP": ([F(2, 3)], {}),
    "GELU": ([F(2, 3)], {}),
    "HARD_SWISH": ([F(2, 3)], {}),
    "LEAKY_RELU": ([F(2, 3)], {"alpha": 0.2}),
    "LOG": ([F(2, 3, positive=True)], {}),
    "RSQRT": ([F(2, 3, positive=True)], {}),
    "SQRT": ([F(2, 3, positive=True)], {}),
    "LOGISTIC": ([F(2, 3)], {}),
    "TANH": ([F(2, 3)], {}),
    "RELU": ([F(2, 3)], {}),
    "RELU6": ([F(2, 3)], {}),
    "RELU_N1_TO_1": ([F(2, 3)], {}),
    "L2_NORMALIZATION": ([F(2, 3)], {}),
    "SOFTMAX": ([F(2, 3)], {"beta": 1.0}),
    "LOG_SOFTMAX": ([F(2, 3)], {}),
    "EXPAND_DIMS": ([F(2, 3), i32(0)], {}),
    "GATHER": ([F(5, 3), Index([[0, 2, 4, 2]])], {"axis": 0}),
    "MEAN": ([F(2, 3, 4), i32([1])], {"keep_dims": True}),
    "SUM": ([F(2, 3, 4), i32([1])], {"keep_dims": False}),
    "REDUCE_MAX": ([F(2, 3), i32([1])], {}),
    "REDUCE_MIN": ([F(2, 3), i32([1])], {}),
    "PAD": ([F(2, 3), i32([[1, 1], [0, 1]])], {}),
    "PADV2": ([F(2, 3), i32([[1, 1], [0, 1]]), F()], {}),
    "PRELU": ([F(1, 2, 3), F(3)], {}),
    "RESHAPE": ([F(2, 3), i32([3, 2])], {}),
    "RESIZE_BILINEAR": ([F(1, 2, 2, 1), i32([4, 4])], {}),
    "RESIZE_NEAREST_NEIGHBOR": ([F(1, 2, 2, 1), i32([4, 4])], {}),
    "REVERSE_V2": ([F(2, 3), i32([1])], {}),
    "SLICE": ([F(2, 3), i32([0, 1]), i32([2, 2])], {}),
    "STRIDED_SLICE": ([F(2, 3), i32([0, 1]), i32([2, 3]), i32([1, 1])], {}),
    "SPLIT": ([i32(1), F(2, 4)], {"num_splits": 2}),
    "SPLIT_V": ([F(2, 4), i32([1, 3]), i32(1)], {"num_splits": 2}),
    "SQUEEZE": ([F(1, 3)], {"squeeze_dims": [0]}),
    "TILE": ([F(2, 3), i32([2, 1])], {}),
    "TRANSPOSE": ([F(2, 3), i32([1, 0])], {}),
}

#: Fused LSTMs keep a constant input float (their calibrated range is their input's); their
#: quantization is tested on real Keras models (test_lstm_int.py).
SKIPPED = {"UNIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_LSTM"}
QUANTIZED_OPS = sorted(n for n, r in ops.OPS.items() if r.quantization is not None and n not in SKIPPED)
#: What a constant holds: ordinary values, zeros only, and an infinity (an attention mask).
FILLS = ("values", "zeros", "inf")


def test_every_quantized_op_kind_has_a_case():
    assert sorted(set(QUANTIZED_OPS) - set(CASES)) == []


def _constant_value(spec: F, fill: str) -> np.ndarray:
    value = spec.draw(RNG)
    if fill == "zeros":
        return np.zeros_like(value)
    if fill == "inf" and value.size:
        value.reshape(-1)[0] = -np.inf
    return value


def _model(op_type: str, constant: set[int], fill: str) -> tuple[bytes, list]:
    """A float model of one ``op_type`` node whose real-valued operands in ``constant`` are
    constants; when no input is left, the node's first output is added to a model input so
    the model has something to calibrate. Returns (model, one calibration sample's feeds)."""
    operands, options = CASES[op_type]
    model = Model()
    sg = model.add_subgraph("main")
    ins, feeds, probe = [], [], []
    for k, o in enumerate(operands):
        if isinstance(o, F) and k in constant:
            value = _constant_value(o, fill)
            ins.append(sg.add_constant(f"c{k}", value))
        elif isinstance(o, F) or isinstance(o, Index):
            value = o.draw(RNG) if isinstance(o, F) else o.value
            t = sg.add_tensor(f"x{k}", DType.from_numpy(value.dtype), value.shape)
            sg.inputs.append(t)
            ins.append(t)
            feeds.append(value)
        else:
            value = o
            ins.append(sg.add_constant(f"k{k}", value))
        probe.append(value)
    outs = [sg.add_tensor(f"y{k}", DType.from_numpy(p.dtype), p.shape)
            for k, p in enumerate(_kernel_outputs(op_type, probe, options, None))]
    op = Operator(op_type, options=options)
    sg.add_operator(op, ins, outs)
    sg.outputs.extend(outs)
    if not sg.inputs:
        x = sg.add_tensor("extra", DType.FLOAT32, outs[0].shape)
        total = sg.add_tensor("sum", DType.FLOAT32, outs[0].shape)
        sg.inputs.append(x)
        sg.add_operator(Operator("ADD"), [outs[0], x], [total])
        sg.outputs[0] = total
        feeds.append(RNG.standard_normal(outs[0].shape).astype(np.float32))
    for o in sg.operators:
        o.version = ops.require(o.op_type).version(o)
    return kiln.write_model(model), feeds


def _cases():
    for name in QUANTIZED_OPS:
        operands, _ = CASES[name]
        real = [k for k, o in enumerate(operands) if isinstance(o, F)]
        choices = [{k} for k in real] + ([set(real)] if len(real) > 1 else [])
        for constant in choices:
            for fill in FILLS:
                yield pytest.param(name, frozenset(constant), fill,
                                   id=f"{name}-const{'+'.join(map(str, sorted(constant)))}-{fill}")


def _run(interp, feeds):
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        if d["dtype"] != x.dtype:   # integer I/O: quantize the float sample
            scale, zero = d["quantization"]
            info = np.iinfo(d["dtype"])
            x = np.clip(np.round(x / scale) + zero, info.min, info.max)
        interp.set_tensor(d["index"], x.astype(d["dtype"]))
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the float model on -inf constants
@pytest.mark.parametrize("name,constant,fill", list(_cases()))
def test_constant_inputs_quantize_or_say_why(name, constant, fill):
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    float_model, feeds = _model(name, set(constant), fill)
    # more samples of the same signs (LOG's input stays positive): the first scaled
    samples = [feeds] + [[f * RNG.uniform(0.5, 1.5, f.shape).astype(f.dtype) if f.dtype.kind == "f" else f
                          for f in feeds] for _ in range(3)]
    modes = [("int8", {}), ("int16x8", {}), ("int8", {"integer_only": True, "inference_input_type": "int8"})]
    for mode, options in modes:
        try:
            quantized = kiln.quantize(float_model, mode, representative_dataset=samples, progress=False, **options)
        except KilnError:
            continue   # refused, with a reason: fine (integer-only with an op left float, ...)
        if fill == "values" and mode == "int8":   # an ordinary constant does not stop int8
            node = next(op for op in kiln.read_model(quantized).main.operators if op.op_type == name)
            assert node.outputs[0].dtype == DType.INT8, f"{name} stayed float"
        ours = _run(kiln.Interpreter(model_content=quantized), feeds)
        theirs = _run(LiteRT(model_content=quantized), feeds)
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and a.dtype == b.dtype, (mode, options)


def test_embedding_table_takes_the_gathered_range():
    """A constant GATHER table (a Keras Embedding) is quantized with the output's calibrated
    parameters, as TF does: the output shares them, the rows gathered fill the int8 range."""
    float_model, feeds = _model("GATHER", {0}, "values")
    quantized = kiln.read_model(kiln.quantize(float_model, "int8", representative_dataset=[feeds], progress=False))
    (gather,) = [op for op in quantized.main.operators if op.op_type == "GATHER"]
    table, out = gather.inputs[0], gather.outputs[0]
    assert table.dtype == out.dtype == DType.INT8 and table.is_constant
    assert table.quantization.scale[0] == out.quantization.scale[0]
    assert table.quantization.zero_point[0] == out.quantization.zero_point[0]
    assert gather.version == 2
    rule = ops.require("GATHER").quantization
    assert rule.output == OutputScale.SAME
