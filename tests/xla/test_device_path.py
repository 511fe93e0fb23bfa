"""The XLA delegate's device path (issue #33): weights as device-resident arguments, outputs kept
on the device between partitions."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
import kiln.xla  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from kiln.xla._jax import x64  # noqa: E402
from kiln.xla.delegate import ARG_MIN_BYTES, hoisted  # noqa: E402
from tests.harness import feed  # noqa: E402
from tests.runtime.zoo import sample_inputs  # noqa: E402

_CONSTANT = re.compile(r"stablehlo\.constant dense<.*?> : tensor<([0-9x]*)([a-z]+[0-9]*)>")


def _largest_constant(hlo: str) -> int:
    """Bytes of the largest constant in a StableHLO module's text."""
    largest = 0
    for dims, kind in _CONSTANT.findall(hlo):
        size = int(np.prod([int(d) for d in dims.split("x") if d])) if dims else 1
        largest = max(largest, size * max(1, int(re.sub(r"\D", "", kind) or 8) // 8))
    return largest


def _lowered_texts(delegate, interp) -> list[str]:
    """The StableHLO of every partition as the delegate compiles it, for the interpreter's current inputs."""
    texts = []
    for kernel in delegate.kernels:
        (key,) = kernel.cache  # one signature was compiled
        specs = [jax.ShapeDtypeStruct(shape, np.dtype(code)) for shape, code in key[:len(kernel.dynamic_inputs)]]
        with x64():
            fn, weights = hoisted(kernel._trace_fn({}), specs, delegate.device_weight, delegate.hoists)
            texts.append(jax.jit(fn).lower(weights, *specs).as_text())
    return texts


@pytest.mark.parametrize("name", ["mobilenet", "transformer", "lstm"])
def test_weights_are_device_arguments_not_hlo_constants(zoo, name):
    data = zoo.bytes(name)
    results, largest = {}, {}
    for mode in ("arguments", "constants"):
        delegate = XlaDelegate(weights=mode)
        interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
        results[mode] = feed(interp, sample_inputs(interp.get_input_details(), 0))
        largest[mode] = max(_largest_constant(t) for t in _lowered_texts(delegate, interp))
        held = [w for k in delegate.kernels for run in k.cache.values() for w in run.weights]
        assert (len(held) > 0) == (mode == "arguments")
        assert all(isinstance(w, jax.Array) for w in held)
    assert largest["arguments"] < ARG_MIN_BYTES <= largest["constants"]
    for a, b in zip(results["arguments"], results["constants"]):
        np.testing.assert_array_equal(a, b)


def test_on_a_cpu_small_models_keep_literals_large_ones_hoist():
    """The default rule (`CPU_LITERAL_BYTES`): literals on a CPU below it, arguments above and elsewhere."""
    from kiln.xla.delegate import CPU_LITERAL_BYTES

    cpu = XlaDelegate("cpu")
    assert not cpu.hoists(CPU_LITERAL_BYTES - 1) and cpu.hoists(CPU_LITERAL_BYTES)
    assert XlaDelegate("cpu", weights="arguments").hoists(1)
    assert not XlaDelegate("cpu", weights="constants").hoists(1 << 40)
    with pytest.raises(kiln.KilnError, match="weights must be"):
        XlaDelegate(weights="device")


def test_weights_are_put_once_for_every_batch_size(zoo, monkeypatch):
    """A second batch size compiles anew but reuses the device buffers of the first."""
    monkeypatch.setattr(kiln.xla.delegate, "ARG_MIN_BYTES", 16)  # the model's weights are small
    data = zoo.bytes("dynamic_batch")
    delegate = XlaDelegate(weights="arguments")
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    for batch in (1, 3):
        feed(interp, sample_inputs(interp.get_input_details(), 0, batch=batch))
    (kernel,) = delegate.kernels
    first, second = (run.weights for run in kernel.cache.values())
    assert first and len(first) == len(second)
    assert all(a is b for a, b in zip(first, second))


def test_outputs_only_the_delegate_reads_stay_on_the_device(zoo):
    """Split around GELU, the transformer's first partition hands the second the first layer
    norm's output (the residual) as a device array; what GELU (on the reference kernels) reads
    comes to NumPy."""
    data = zoo.bytes("transformer")
    plain = kiln.Interpreter(model_content=data, experimental_delegates=[XlaDelegate()])
    delegate = XlaDelegate(ops=set(kiln.xla.lowered_ops()) - {"GELU"})
    split = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    inputs = sample_inputs(plain.get_input_details(), 0)
    expected = feed(plain, inputs)
    split.allocate_tensors()
    first = delegate.kernels[0]
    seen = {}
    invoke = type(first).invoke

    def spy(self, values):
        out = seen[id(self)] = invoke(self, values)
        return out

    first.invoke = spy.__get__(first)
    np.testing.assert_allclose(feed(split, inputs)[0], expected[0], rtol=1e-5, atol=1e-5)
    kept = delegate.on_device(first)
    assert kept, "some output of the first partition is read only by later partitions"
    gelu_inputs = {t.name for op in kiln.read_model(data).subgraphs[0].operators if op.name == "GELU"
                      for t in op.inputs}
    for k, value in enumerate(seen[id(first)]):
        assert isinstance(value, jax.Array) == (k in kept)
    assert not any(first.partition.outputs[k].name in gelu_inputs for k in kept)

