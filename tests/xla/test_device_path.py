"""The XLA delegate's device path (issue #33): weights as device-resident arguments, outputs kept
on the device between partitions, the persistent compilation cache, batch buckets and the
bfloat16 policy over recurrent models."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
import kiln.xla  # noqa: E402
from kiln.xla import XlaDelegate  # noqa: E402
from kiln.xla._jax import x64  # noqa: E402
from kiln.xla.delegate import ARG_MIN_BYTES, hoisted  # noqa: E402
from kiln.schema import Activation  # noqa: E402
from tests.harness import Const, Var, feed, single_op_model  # noqa: E402
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


_SECOND_PROCESS = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import jax
    from jax import monitoring
    import kiln
    from kiln.xla import XlaDelegate
    from jax._src.dispatch import BACKEND_COMPILE_EVENT
    counts = {"requests": 0, "hits": 0}  # executables wanted (compiled, or read from the cache)
    monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: counts.__setitem__("requests", counts["requests"] + (event == BACKEND_COMPILE_EVENT)))
    monitoring.register_event_listener(
        lambda event, **kw: counts.__setitem__("hits", counts["hits"] + (event == "/jax/compilation_cache/cache_hits")))
    start = time.perf_counter()
    d = XlaDelegate()
    it = kiln.Interpreter(model_path=sys.argv[1], experimental_delegates=[d])
    it.allocate_tensors()
    for t in it.get_input_details():
        it.set_tensor(t["index"], np.ones(t["shape"], t["dtype"]))
    it.invoke()
    out = it.get_tensor(it.get_output_details()[0]["index"])
    counts["compiles"] = counts["requests"] - counts["hits"]
    print(json.dumps({**counts, "seconds": time.perf_counter() - start, "out": out.ravel()[:8].tolist(),
                      "dir": jax.config.jax_compilation_cache_dir}))
""")


def _second_process(model, **env) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    for name in ("JAX_COMPILATION_CACHE_DIR", "KILN_XLA_CACHE"):
        if env.get(name) is None:
            env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, str(model)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(zoo, tmp_path):
    """JAX's persistent cache, on by default in $KILN_XLA_CACHE: the second process loading the
    model gets every partition's executable from it."""
    model = tmp_path / "mobilenet.tflite"
    model.write_bytes(zoo.bytes("mobilenet"))
    cache = tmp_path / "cache"
    first = _second_process(model, KILN_XLA_CACHE=str(cache), JAX_COMPILATION_CACHE_DIR=None)
    second = _second_process(model, KILN_XLA_CACHE=str(cache), JAX_COMPILATION_CACHE_DIR=None)
    assert first["dir"] == second["dir"] == str(cache)
    assert first["compiles"] >= 1 and first["hits"] == 0
    assert second["compiles"] == 0 and second["hits"] == first["compiles"]
    assert first["out"] == second["out"]
    assert any(cache.iterdir())


def test_cache_folder_opt_out_and_the_users_own_jax_setting(zoo, tmp_path):
    model = tmp_path / "mlp.tflite"
    model.write_bytes(zoo.bytes("mlp"))
    off = _second_process(model, KILN_XLA_CACHE="", JAX_COMPILATION_CACHE_DIR=None)
    assert off["dir"] is None and off["hits"] == 0
    mine = tmp_path / "mine"
    users = _second_process(model, KILN_XLA_CACHE=str(tmp_path / "kiln"), JAX_COMPILATION_CACHE_DIR=str(mine))
    assert users["dir"] == str(mine) and not (tmp_path / "kiln").exists()


def _count_compiles():
    """A list that grows by one per executable JAX compiles or takes from its persistent cache."""
    from jax import monitoring
    from jax._src.dispatch import BACKEND_COMPILE_EVENT

    seen = []
    monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: seen.append(event) if event == BACKEND_COMPILE_EVENT else None)
    return seen


def test_batch_buckets_compile_once_at_load_then_pad_and_slice(zoo):
    data = zoo.bytes("dynamic_batch")
    delegate = XlaDelegate(batch_sizes=[8, 2])
    ours = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    ref = kiln.Interpreter(model_content=data)
    seen = _count_compiles()
    ours.allocate_tensors()
    (kernel,) = delegate.kernels
    assert kernel.buckets is not None and kernel.compiles == len(seen) == 2  # buckets 2 and 8, at load
    for batch in (1, 2, 5, 8, 3):
        x = sample_inputs(ours.get_input_details(), batch, batch=batch)
        (a,), (e,) = feed(ours, x), feed(ref, x)
        assert a.shape == e.shape and a.shape[0] == batch
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    assert kernel.compiles == len(seen) == 2, "every batch ran on a bucket compiled at load"
    x = sample_inputs(ours.get_input_details(), 0, batch=11)  # past the last bucket: compiled as is
    np.testing.assert_allclose(feed(ours, x)[0], feed(ref, x)[0], rtol=1e-5, atol=1e-6)
    assert kernel.compiles == len(seen) == 3
    with pytest.raises(kiln.KilnError, match="batch_sizes must be positive ints"):
        XlaDelegate(batch_sizes=[0, 4])


def _bf16_against_float32(data, inputs=None):
    """(relative error of the bfloat16 policy's first output against float32's, its delegate, its interpreter)."""
    f32 = kiln.Interpreter(model_content=data, experimental_delegates=[XlaDelegate()])
    delegate = XlaDelegate(dtype_policy="bfloat16")
    bf16 = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    inputs = inputs if inputs is not None else sample_inputs(f32.get_input_details(), 0)
    (e, *_), (a, *_) = feed(f32, inputs), feed(bf16, inputs)
    assert a.dtype == e.dtype == np.float32
    return float(np.max(np.abs(a - e))) / max(1.0, float(np.max(np.abs(e)))), delegate, bf16


@pytest.mark.parametrize("name", ["lstm", "bilstm", "control_flow"])
def test_bfloat16_policy_lowers_recurrent_models_whole(zoo, name):
    """Sequence LSTMs and loop bodies lower under the policy too (they went back to the CPU):
    products on bfloat16 operands accumulate in float32, states stay float32; the error against
    float32 is the order of test_delegate's bfloat16 bound (5% of the output's scale)."""
    err, delegate, interp = _bf16_against_float32(zoo.bytes(name))
    assert delegate.rejected == {}
    assert err < 0.05
    if name != "control_flow":
        dots = re.findall(r"stablehlo\.dot_general .*?: \(tensor<[0-9x]*(\w+)>, tensor<[0-9x]*(\w+)>\) -> "
                          r"tensor<[0-9x]*(\w+)>", "\n".join(_lowered_texts(delegate, interp)))
        assert dots and all(d == ("bf16", "bf16", "f32") for d in dots), dots


def test_bfloat16_policy_lowers_the_sequence_rnn_and_keeps_its_state_float32():
    rng = np.random.default_rng(3)
    w, r, b = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((5, 3), (5, 5), (5,)))
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    model = single_op_model("UNIDIRECTIONAL_SEQUENCE_RNN",
                            [x, Const(w), Const(r), Const(b), Var(np.zeros((2, 5), np.float32))],
                            options={"fused_activation_function": Activation.TANH})
    err, delegate, interp = _bf16_against_float32(model, [x])
    assert delegate.rejected == {} and err < 0.05
    state = next(d for d in interp.get_tensor_details() if d["name"] == "var4")
    assert state["dtype"] == np.float32 and interp.get_tensor(state["index"]).any()
