"""int8 SUM: kiln's kernel is LiteRT's optimized one (its default resolver, with or without
XNNPACK), bit for bit over random shapes, axes (negative, repeated, none), keep_dims and
parameters — LiteRT's reference kernel reads int8 codes as uint8, so BUILTIN_REF is not the
oracle here — and the int8 quantizer writes SUM as TF 2.21 does (own calibrated range,
version 2; float in 16x8, as TF leaves it)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Model, Operator
from kiln.schema import DType
from tests.harness import run_api
from tests.quant.test_dispatch import Const, In, one_op, qp

RNG = np.random.default_rng(3)


def _case(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in rng.integers(1, 7, rng.integers(1, 5)))
    nax = int(rng.integers(0, len(shape) + 1))
    axes = np.array(sorted(rng.choice(len(shape), nax, replace=False)) if nax else [], np.int32)
    if rng.random() < 0.3 and len(axes):
        axes = axes - len(shape)                      # negative axes
    if rng.random() < 0.2 and len(axes):
        axes = np.concatenate([axes, axes[:1]])       # a repeated axis
    keep = bool(rng.random() < 0.5)
    reduced = {int(a) % len(shape) for a in axes}
    out_shape = tuple(1 if i in reduced else d for i, d in enumerate(shape) if keep or i not in reduced)
    x_qp = qp(float(np.exp(rng.uniform(np.log(0.001), np.log(0.5)))), int(rng.integers(-128, 128)))
    y_qp = qp(float(np.exp(rng.uniform(np.log(0.001), np.log(5)))), int(rng.integers(-128, 128)))
    x = rng.integers(-128, 128, shape).astype(np.int8)
    return one_op("SUM", [In(x, x_qp), Const(axes)], [(np.int8, out_shape, y_qp)], {"keep_dims": keep})


@pytest.mark.parametrize("block", range(4))
def test_int8_sum_equals_litert_default_kernel(block):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    for seed in range(block * 60, block * 60 + 60):
        model, feeds = _case(seed)
        got = run_api(kiln.Interpreter(model_content=model), feeds)[0]
        for kind in (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, OpResolverType.AUTO):
            want = run_api(Interpreter(model_content=model, experimental_op_resolver_type=kind), feeds)[0]
            np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}, {kind.name}")


def _float_sum_model() -> bytes:
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 6, 5))
    w = sg.add_constant("w", RNG.standard_normal((8, 5)).astype(np.float32))
    h = sg.add_tensor("h", DType.FLOAT32, (1, 6, 8))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 8))
    sg.inputs.append(x)
    sg.outputs.append(y)
    sg.add_operator(Operator("FULLY_CONNECTED", options={"keep_num_dims": True}), [x, w, None], [h])
    sg.add_operator(Operator("SUM", options={"keep_dims": False}), [h, sg.add_constant("axis", np.int32([1]))], [y])
    for op in sg.operators:
        op.version = kiln.ops.require(op.op_type).version(op)
    return kiln.write_model(model)


def test_quantizer_writes_int8_sum_and_keeps_16x8_sum_float():
    samples = [[RNG.standard_normal((1, 6, 5)).astype(np.float32)] for _ in range(8)]
    int8 = kiln.read_model(kiln.quantize(_float_sum_model(), "int8", representative_dataset=samples, progress=False))
    (total,) = [op for op in int8.main.operators if op.op_type == "SUM"]
    assert total.outputs[0].dtype == DType.INT8 and total.version == 2
    assert total.outputs[0].quantization.scale[0] != total.inputs[0].quantization.scale[0]   # its own range
    int16 = kiln.read_model(kiln.quantize(_float_sum_model(), "int16x8", representative_dataset=samples,
                                          progress=False))
    (total,) = [op for op in int16.main.operators if op.op_type == "SUM"]
    assert total.outputs[0].dtype == DType.FLOAT32
