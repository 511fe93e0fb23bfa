"""kiln's int4 weight mode (int8 activations, int4 per-channel weights) on the ops LiteRT 2.3
has an int8 x int4 kernel for, and what LiteRT 2.3 does with blockwise-quantized weights
(docs/int4_weights.md)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.quant import quantize
from kiln.schema import DType
from tests.converter import zoo
from tests.harness import feed

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _litert(model: bytes, x: np.ndarray, kind: str) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return feed(Interpreter(model_content=model, experimental_op_resolver_type=getattr(OpResolverType, kind)), [x])[0]


def _kiln(model: bytes, x: np.ndarray) -> np.ndarray:
    return feed(kiln.Interpreter(model_content=model), [x])[0]


def _stored_as_int8(model: bytes) -> bytes:
    """The same model with its int4 weights stored as int8 (same values), ops re-versioned."""
    m = kiln.read_model(model)
    for op in m.main.operators:
        for t in op.inputs:
            if t is not None and t.dtype == DType.INT4:
                t.dtype = DType.INT8
        op.version = ops.get(op.op_type).version(op)
    return kiln.write_model(m)


def test_depthwise_int4_weights_run_on_litert_s_optimized_kernel():
    """DEPTHWISE_CONV_2D with int4 weights (v7), int8 I/O. Measured on LiteRT 2.3: its
    BUILTIN_REF resolver registers the op only up to v6; its optimized kernel (with or
    without XNNPACK) runs v7 and gives exactly its int8 kernel's bits on the same values.
    kiln computes LiteRT's reference arithmetic (two roundings): bit-exact with BUILTIN_REF
    on the int8-stored copy, within one LSB of the optimized kernel (which rounds once)."""
    x_in = keras.Input((8, 8, 4), batch_size=1)
    h = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu")(x_in)
    m = keras.Model(x_in, keras.layers.Conv2D(6, 1)(h))
    zoo.randomize(m)
    float_model = tf.lite.TFLiteConverter.from_keras_model(m).convert()
    rng = np.random.default_rng(0)
    data = [rng.uniform(-1, 1, (1, 8, 8, 4)).astype(np.float32) for _ in range(8)]
    q = quantize(float_model, "int4", representative_dataset=data, integer_only=True,
                 inference_input_type="int8", inference_output_type="int8", progress=False)
    got = {(op.op_type, op.version, op.inputs[1].dtype.name) for op in kiln.read_model(q).main.operators}
    assert got == {("DEPTHWISE_CONV_2D", 7, "INT4"), ("CONV_2D", 7, "INT4")}
    as_int8 = _stored_as_int8(q)
    with pytest.raises(ValueError, match="DEPTHWISE_CONV_2D' version '7'"):
        _litert(q, rng.integers(-128, 128, (1, 8, 8, 4)).astype(np.int8), "BUILTIN_REF")
    for _ in range(4):
        x = rng.integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)
        ours = _kiln(q, x)
        np.testing.assert_array_equal(ours, _litert(as_int8, x, "BUILTIN_REF"))
        optimized = _litert(q, x, "BUILTIN_WITHOUT_DEFAULT_DELEGATES")
        np.testing.assert_array_equal(optimized, _litert(as_int8, x, "BUILTIN_WITHOUT_DEFAULT_DELEGATES"))
        assert np.abs(optimized.astype(int) - ours.astype(int)).max() <= 1
        assert np.abs(_litert(q, x, "AUTO").astype(int) - ours.astype(int)).max() <= 1


def _blockwise_int4_fc(block: int = 32) -> bytes:
    """TF's float FULLY_CONNECTED (2×64 · 64×8) with its weights rewritten as int4 with the
    schema's BlockwiseQuantization (float16 scales per 32-wide block), as LiteRT's tools write."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as S

    w = np.random.default_rng(0).uniform(-1, 1, (64, 8)).astype(np.float32)
    f = tf.function(lambda x: tf.matmul(x, w), input_signature=[tf.TensorSpec([2, 64], tf.float32)])
    m = S.ModelT.InitFromPackedBuf(bytearray(tf.lite.TFLiteConverter.from_concrete_functions(
        [f.get_concrete_function()]).convert()), 0)
    sg = m.subgraphs[0]
    wt = sg.tensors[sg.operators[0].inputs[1]]
    blocks = np.frombuffer(bytes(m.buffers[wt.buffer].data), np.float32).reshape(8, 64 // block, block)
    scales = (np.abs(blocks).max(-1) / 7).astype(np.float16)
    q = np.clip(np.round(blocks / scales[..., None].astype(np.float32)), -8, 7).astype(np.int8).reshape(-1)
    nibbles = (q & 0xF).astype(np.uint8)
    m.buffers[wt.buffer].data = (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()
    wt.type = S.TensorType.INT4
    scale_buffer = S.BufferT()
    scale_buffer.data = scales.tobytes()
    m.buffers.append(scale_buffer)
    st = S.TensorT()
    st.shape, st.type, st.buffer, st.name = list(scales.shape), S.TensorType.FLOAT16, len(m.buffers) - 1, b"scales"
    sg.tensors.append(st)
    details = S.BlockwiseQuantizationT()
    details.scales, details.zeroPoints, details.blockSize = len(sg.tensors) - 1, -1, block
    wt.quantization = S.QuantizationParametersT()
    wt.quantization.detailsType = S.QuantizationDetails.BlockwiseQuantization
    wt.quantization.details = details
    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def test_blockwise_quantized_weights_are_refused_by_name():
    """kiln reads no QuantizationDetails: a blockwise-quantized tensor is refused when the
    model is read (it used to load as an unquantized int4 tensor and fail later, "weights of
    type int8 ... float only"). LiteRT 2.3's optimized FULLY_CONNECTED does run it."""
    model = _blockwise_int4_fc()
    x = np.random.default_rng(1).uniform(-1, 1, (2, 64)).astype(np.float32)
    assert np.abs(_litert(model, x, "BUILTIN_WITHOUT_DEFAULT_DELEGATES")).max() > 0.1
    with pytest.raises(kiln.KilnError, match="blockwise quantization details .* not supported"):
        kiln.read_model(model)
    with pytest.raises(kiln.KilnError, match="blockwise"):
        kiln.Interpreter(model_content=model)
