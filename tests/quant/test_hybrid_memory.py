"""Large dynamic-range models on kiln's own kernels keep their int8 weights int8 (issue #23,
item 5): the NumPy delegate widens a FULLY_CONNECTED's weights once only when the copy fits
its budget, else a block of columns at each invoke (kiln.kernels.fixedpoint.ExactProduct, the
reference kernel's product too).
Integer sums are exact in any order, so every way gives LiteRT's BUILTIN_REF bits."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import kiln
from kiln.delegates import NumpyDelegate
from kiln.kernels import fixedpoint
from tests.harness import Const, feed, single_op_model
from tests.quant.test_hybrid import _ref, _weights

RNG = np.random.default_rng(23)


def _model(asymmetric: bool, rows: int = 3, depth: int = 700, units: int = 90):
    x = RNG.normal(0, 1.5, (rows, depth)).astype(np.float32)
    q, scale, wc = _weights(RNG.normal(0, 0.1, (units, depth)).astype(np.float32), 0)
    bias = RNG.normal(0, 0.5, units).astype(np.float32)
    model = single_op_model("FULLY_CONNECTED", [x, wc, Const(bias)],
                            options={"asymmetric_quantize_inputs": asymmetric},
                            out_dtypes=[np.float32], out_shapes=[(rows, units)])
    return model, x


@pytest.mark.parametrize("asymmetric", [False, True])
def test_blocked_products_equal_builtin_ref(monkeypatch, asymmetric):
    model, x = _model(asymmetric)
    want = _ref(model, x)
    monkeypatch.setattr(fixedpoint, "WIDEN_BUDGET", 0)          # never widen the weights whole
    monkeypatch.setattr(fixedpoint, "BLOCK_BYTES", 700 * 4 * 7)  # 7 columns a block: 13 blocks
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate],
                              experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    np.testing.assert_array_equal(feed(interp, [x])[0], want)
    assert delegate.lowered, "the hybrid FULLY_CONNECTED ran its lowering"
    monkeypatch.setattr(fixedpoint, "BLOCK_BYTES", 700 * 4 * 5)          # the reference kernel: 5 columns a block
    ref = kiln.Interpreter(model_content=model, experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_REF)
    np.testing.assert_array_equal(feed(ref, [x])[0], want)


def _peak_allocated_mib(path, depth: int) -> int:
    """Peak NumPy / Python allocations (MiB, tracemalloc: the memory-mapped weights are not
    counted, every copy is) while the model opens on the NumPy delegate and invokes twice."""
    x = np.ones((1, depth), np.float32)
    tracemalloc.start()
    try:
        delegate = NumpyDelegate()
        interp = kiln.Interpreter(model_path=str(path), experimental_delegates=[delegate],
                                  experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        interp.invoke()
        assert delegate.lowered
        return tracemalloc.get_traced_memory()[1] >> 20
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # a 96 MiB model (the fast lane checks the blocked products bit for bit, above)
def test_a_large_model_is_not_widened_whole(tmp_path, monkeypatch):
    """A 96 MiB int8 FULLY_CONNECTED (dynamic range) on the NumPy delegate allocates small
    blocks, not a float copy of 4-8 bytes a weight; the control run, with the widening budget
    lifted, shows what the copy costs."""
    from kiln.ir import QuantParams

    units, depth = 12288, 8192
    w = np.random.default_rng(0).integers(-127, 128, (units, depth), dtype=np.int8)
    path = tmp_path / "big.tflite"
    path.write_bytes(single_op_model("FULLY_CONNECTED", [np.zeros((1, depth), np.float32),
                                                         Const(w, QuantParams(np.full(units, 0.01), np.zeros(units)))],
                                     out_dtypes=[np.float32], out_shapes=[(1, units)]))
    del w
    blocked = _peak_allocated_mib(path, depth)
    monkeypatch.setattr(fixedpoint, "WIDEN_BUDGET", 1 << 40)
    widened = _peak_allocated_mib(path, depth)
    assert widened >= 768, f"control: the widened float64 copy should cost 768 MiB ({widened} MiB)"
    assert blocked < 64, f"invoking allocated {blocked} MiB at its peak (the int8 weights are 96 MiB)"


def test_blocked_conv_product_equals_builtin_ref(monkeypatch):
    """The hybrid CONV_2D lowering takes the same blocked product (13 output channels, 3 a block)."""
    x = RNG.normal(0, 1, (2, 7, 7, 16)).astype(np.float32)
    q, scale, wc = _weights(RNG.normal(0, 0.2, (13, 3, 3, 16)).astype(np.float32), 0)
    bias = RNG.normal(0, 0.5, 13).astype(np.float32)
    model = single_op_model("CONV_2D", [x, wc, Const(bias)], options={"padding": 0, "stride_h": 1, "stride_w": 1},
                            out_dtypes=[np.float32], out_shapes=[(2, 7, 7, 13)])
    monkeypatch.setattr(fixedpoint, "WIDEN_BUDGET", 0)
    monkeypatch.setattr(fixedpoint, "BLOCK_BYTES", 3 * 3 * 16 * 4 * 3)
    delegate = NumpyDelegate()
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[delegate],
                              experimental_op_resolver_type=kiln.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    np.testing.assert_array_equal(feed(interp, [x])[0], _ref(model, x))
    assert delegate.lowered
