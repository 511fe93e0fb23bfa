"""XlaDelegate and to_jax on the runtime zoo (models TensorFlow's converter wrote), against
LiteRT; partitioning, per-node reasons, the compile cache and the no-JAX error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
import kiln.xla  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln.xla import LoweringError, XlaDelegate, register_lowering, to_jax  # noqa: E402
from tests.harness import assert_close, feed  # noqa: E402
from tests.runtime.conftest import litert  # noqa: E402
from tests.runtime.test_zoo import ATOL, E2E_RTOL, RTOL  # noqa: E402
from tests.runtime.zoo import ZOO, sample_inputs  # noqa: E402

#: Zoo models and the ops in them that stay on the reference kernels, with why.
NOT_LOWERED: dict[str, dict[str, str]] = {}
MODELS = list(ZOO)


def _xla_interpreter(data, **kwargs):
    delegate = XlaDelegate(**kwargs)
    return kiln.Interpreter(model_content=data, experimental_delegates=[delegate]), delegate


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_claimed_and_matches_litert(zoo, name):
    data = zoo.bytes(name)
    ours, delegate = _xla_interpreter(data)
    ref = litert(data)
    for seed in (0, 1):  # the second invoke hits the compile cache (and LSTMs carry their states)
        if name == "variables":
            break  # signatures only: see test_signatures_match_litert
        inputs = sample_inputs(ref.get_input_details(), seed)
        expected, actual = feed(ref, inputs), feed(ours, inputs)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol=E2E_RTOL.get(name, RTOL), atol=ATOL, what=f"{name} output {k} (seed {seed})")
    if name != "variables":
        assert delegate.claimed
        assert all(k.compiles == 1 for k in delegate.kernels), "an unchanged input shape compiled again"
    allowed = NOT_LOWERED.get(name, {})
    for (index, op_name, _), reason in delegate.rejected.items():
        assert op_name in allowed, f"{name}: node {index} ({op_name}) not claimed: {reason}"
        assert op_name in reason, reason  # the reason names the op


@pytest.mark.parametrize("name", ["variables", "control_flow"])
def test_signatures_match_litert(zoo, name):
    data = zoo.bytes(name)
    ours, _ = _xla_interpreter(data)
    ref = litert(data)
    for key, io in ref.get_signature_list().items():
        rng = np.random.default_rng(0)
        runner = ref.get_signature_runner(key)
        feeds = {}
        for n, d in runner.get_input_details().items():
            shape = [max(1, int(s)) for s in d["shape"]]
            feeds[n] = (rng.standard_normal(shape).astype(d["dtype"]) if np.dtype(d["dtype"]).kind == "f"
                        else np.full(shape, 3, d["dtype"]))
        for _ in range(2):  # variables carry over between calls
            expected = runner(**feeds)
            actual = ours.get_signature_runner(key)(**feeds)
            for out in io["outputs"]:
                assert_close(actual[out], expected[out], rtol=RTOL, atol=ATOL, what=f"{name}/{key}/{out}")


def test_partitions_are_maximal_runs_and_reasons_are_per_node(zoo):
    """Without SOFTMAX in its op set, the delegate splits the transformer around it."""
    data = zoo.bytes("transformer")
    ops = kiln.read_model(data).subgraphs[0].operators
    everything_but_softmax = set(kiln.xla.lowered_ops()) - {"SOFTMAX"}
    ours, delegate = _xla_interpreter(data, ops=everything_but_softmax)
    ref = litert(data)
    inputs = sample_inputs(ref.get_input_details(), 0)
    (a,), (e,) = feed(ours, inputs), feed(ref, inputs)
    assert_close(a, e, rtol=RTOL, atol=ATOL)
    softmax = [i for i, op in enumerate(ops) if op.name == "SOFTMAX"]
    assert softmax and sorted(i for i, _, _ in delegate.rejected) == softmax
    for (i, name, _), reason in delegate.rejected.items():
        assert name == "SOFTMAX" and "SOFTMAX" in reason
    claimed = sorted(i for i, _, _ in delegate.claimed)
    assert sorted(claimed + softmax) == list(range(len(ops)))
    runs = sum(1 for i in claimed if i - 1 not in claimed)
    assert len(delegate.kernels) == runs == len(softmax) + 1, "one partition per maximal run of claimed nodes"


def test_resize_compiles_once_per_shape_then_hits_the_cache(zoo):
    data = zoo.bytes("dynamic_batch")
    ours, delegate = _xla_interpreter(data)
    ref = litert(data)
    (d,) = ours.get_input_details()
    for batch in (3, 1, 3, 7, 1):
        for interp in (ref, ours):
            interp.resize_tensor_input(d["index"], [batch, 8, 8, 3], strict=True)
        x = sample_inputs(ours.get_input_details(), batch, batch=batch)
        (e,), (a,) = feed(ref, x, allocate=True), feed(ours, x, allocate=True)
        assert_close(a, e, rtol=RTOL, atol=ATOL, what=f"batch {batch}")
    (kernel,) = delegate.kernels
    assert kernel.compiles == 3  # batches 3, 1, 7; the repeats came from the cache
    assert kernel.compile_seconds is not None and kernel.compile_seconds > 0


def test_cache_is_bounded_and_least_recently_used_goes(zoo):
    data = zoo.bytes("dynamic_batch")
    ours, delegate = _xla_interpreter(data, cache_size=2)
    (d,) = ours.get_input_details()
    for batch in (1, 2, 1, 3, 1, 2):
        ours.resize_tensor_input(d["index"], [batch, 8, 8, 3])
        feed(ours, sample_inputs(ours.get_input_details(), 0, batch=batch), allocate=True)
    (kernel,) = delegate.kernels
    assert len(kernel.cache) == 2
    # 1, 2 compile; 1 hits; 3 compiles and evicts 2; 1 hits; 2 compiles again (evicting 3).
    assert kernel.compiles == 4


def test_bad_settings_are_kiln_errors():
    with pytest.raises(KilnError, match="dtype_policy"):
        XlaDelegate(dtype_policy="float8")
    with pytest.raises(KilnError, match="cache_size"):
        XlaDelegate(cache_size=0)
    with pytest.raises(KilnError, match="NOT_AN_OP"):
        XlaDelegate(ops=["ADD", "NOT_AN_OP"])
    with pytest.raises(KilnError, match="compiler_options must be a dict"):
        XlaDelegate(compiler_options=["xla_cpu_multi_thread_eigen"])


def test_compiler_options_reach_xla(zoo):
    """The CPU defaults plus the user's options; one XLA refuses is a kiln error naming the partition."""
    data = zoo.bytes("mlp")
    ours, delegate = _xla_interpreter(data, compiler_options={"xla_cpu_multi_thread_eigen": False})
    assert delegate.compiler_options == {**kiln.xla.delegate.CPU_COMPILER_OPTIONS, "xla_cpu_multi_thread_eigen": False}
    inputs = sample_inputs(ours.get_input_details(), 0)
    assert_close(feed(ours, inputs)[0], feed(litert(data), inputs)[0], rtol=RTOL, atol=ATOL)
    bad, _ = _xla_interpreter(data, compiler_options={"xla_no_such_option": True})
    with pytest.raises(KilnError, match=r"XLA delegate, nodes 0\.\.\d+: XLA cannot compile"):
        feed(bad, inputs)


def test_cpu_defaults_leave_options_named_in_xla_flags_to_the_user(zoo, tmp_path):
    """A compile option would override XLA_FLAGS, so a default the user names there is dropped.
    XLA reads XLA_FLAGS once per process, hence the subprocesses: with YNNPACK's dot fusion asked
    for in XLA_FLAGS the compiled module has one; without, the default (off) holds."""
    defaults = kiln.xla.delegate.cpu_defaults
    assert defaults("") == kiln.xla.delegate.CPU_COMPILER_OPTIONS
    assert "xla_cpu_multi_thread_eigen" not in defaults("--xla_cpu_multi_thread_eigen=true --xla_dump_to=/tmp")
    assert "xla_cpu_multi_thread_eigen" in defaults("--xla_cpu_multi_thread_eigen_x=1")
    model = tmp_path / "cnn.tflite"  # its dots are large enough for YNNPACK's cost model
    model.write_bytes(zoo.bytes("cnn"))
    script = textwrap.dedent(f"""
        import numpy as np, kiln
        d = kiln.XlaDelegate()
        it = kiln.Interpreter(model_path={str(model)!r}, experimental_delegates=[d])
        it.allocate_tensors()
        for t in it.get_input_details():
            it.set_tensor(t["index"], np.zeros(t["shape"], t["dtype"]))
        it.invoke()
        print(sorted(d.compiler_options), "__ynn_fusion" in next(iter(d.kernels[0].cache.values())).as_text())
    """)
    repo = Path(__file__).resolve().parents[2]
    seen = {}
    for flags in ("", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT"):
        env = dict(os.environ, PYTHONPATH=str(repo), XLA_FLAGS=flags, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[flags] = proc.stdout.strip().splitlines()[-1]
    assert seen[""] == str(sorted(kiln.xla.delegate.CPU_COMPILER_OPTIONS)) + " False"
    assert seen["--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT"] == "['xla_cpu_multi_thread_eigen'] True"


def test_bfloat16_policy_stays_close(zoo):
    data = zoo.bytes("cnn")
    ours, delegate = _xla_interpreter(data, dtype_policy="bfloat16")
    inputs = sample_inputs(ours.get_input_details(), 0)
    (a,), (e,) = feed(ours, inputs), feed(litert(data), inputs)
    assert a.dtype == np.float32 and delegate.rejected == {}
    assert float(np.max(np.abs(a - e))) < 0.05 * max(1.0, float(np.max(np.abs(e))))


@pytest.mark.parametrize("name", ["mlp", "cnn", pytest.param("mobilenet", marks=pytest.mark.slow), "transformer", "dynamic_batch",
                                  "lstm", "bilstm"])
def test_to_jax_matches_litert_eager_and_jitted(zoo, name):
    data = zoo.bytes(name)
    fn, params = to_jax(data)
    assert params and all(isinstance(v, np.ndarray) for v in params.values())
    ref = litert(data)
    inputs = sample_inputs(ref.get_input_details(), 0)
    expected = feed(ref, inputs)
    for run in (fn, jax.jit(fn)):
        actual = run(params, *inputs)
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_close(np.asarray(a), e, rtol=E2E_RTOL.get(name, RTOL), atol=ATOL, what=f"{name} output {k}")


@pytest.mark.parametrize("name", ["lstm", "bilstm"])
def test_to_jax_hands_fused_lstm_weights_in_params(zoo, name):
    """The LSTM's weights are parameters, not constants baked into the function: every one
    is in params, and the outputs follow them (a gradient reaches each)."""
    from kiln.format import read_model

    data = zoo.bytes(name)
    fn, params = to_jax(data)
    lstm_weights = {t.name for op in read_model(data).main.operators if op.op_type.endswith("SEQUENCE_LSTM")
                    for t in op.inputs if t is not None and t.is_constant and t.dtype.is_float}
    assert lstm_weights and lstm_weights <= set(params)
    inputs = sample_inputs(litert(data).get_input_details(), 0)
    grads = jax.grad(lambda p: sum(jax.numpy.sum(o) for o in fn(p, *inputs)))(params)
    assert all(float(np.abs(np.asarray(grads[w])).max()) > 0 for w in lstm_weights)
    scaled = {k: (v * 0.5 if k in lstm_weights else v) for k, v in params.items()}
    assert not np.allclose(np.asarray(fn(scaled, *inputs)[0]), np.asarray(fn(params, *inputs)[0]))


def test_to_jax_vmaps_over_a_batch(zoo):
    fn, params = to_jax(zoo.bytes("mlp"))
    xs = np.random.default_rng(0).standard_normal((4, 1, 20)).astype(np.float32)
    batched = jax.vmap(lambda x: fn(params, x)[0])(xs)
    for i in range(4):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(fn(params, xs[i])[0]), rtol=1e-6)


def test_to_jax_names_the_ops_it_cannot_lower():
    """A 16x8 FULLY_CONNECTED with a zero point on its int16 input (no lowering: LiteRT's
    kernel refuses it) between two lowered ops."""
    from kiln.format import write_model
    from kiln.ir import Model, Operator, QuantParams
    from kiln.schema import DType

    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (2, 4))
    a = sg.add_tensor("a", DType.INT16, (2, 4), quantization=QuantParams(np.array([0.01], np.float32),
                                                                         np.array([5], np.int64)))
    w = sg.add_constant("w", np.ones((3, 4), np.int8), quantization=QuantParams(np.array([0.02], np.float32),
                                                                                  np.array([0], np.int64)))
    b = sg.add_tensor("b", DType.INT16, (2, 3), quantization=QuantParams(np.array([0.05], np.float32),
                                                                         np.array([0], np.int64)))
    y = sg.add_tensor("y", DType.FLOAT32, (2, 3))
    sg.inputs.append(x)
    sg.outputs.append(y)
    for op, ins, outs in (("QUANTIZE", [x], [a]), ("FULLY_CONNECTED", [a, w], [b]), ("DEQUANTIZE", [b], [y])):
        node = Operator(op)
        sg.add_operator(node, ins, outs)
        node.version = kiln.ops.require(op).version(node)
    with pytest.raises(KilnError, match=r"1 node\(s\).*\n.*node 1 \(FULLY_CONNECTED\): .*non-zero zero points"):
        to_jax(write_model(model))


def test_to_jax_lowers_while_and_if(zoo):
    fn, params = to_jax(zoo.bytes("control_flow"))
    jitted = jax.jit(fn)
    ref = litert(zoo.bytes("control_flow")).get_signature_runner()
    for n in (0, 2, 5, 9):
        x = np.random.default_rng(n).standard_normal((1, 4)).astype(np.float32)
        (out,) = jitted(params, x, np.array(n, np.int32))  # one compile: n is a run-time value
        assert_close(np.asarray(out), ref(x=x, n=np.array(n, np.int32))["out"], rtol=RTOL, atol=ATOL, what=f"n={n}")


def test_register_lowering_refuses_unknown_ops_and_second_registrations():
    with pytest.raises(LoweringError, match="no op record"):
        register_lowering("NOT_AN_OP", lambda call, x: x)
    with pytest.raises(LoweringError, match="already has a lowering"):
        register_lowering("ADD", lambda call, a, b: a + b)


def test_without_jax_kiln_works_and_the_backend_says_how_to_get_it(tmp_path, zoo):
    """A meta-path blocker makes ``import jax`` fail in a fresh interpreter."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys

        class _NoJax:
            def find_spec(self, name, path=None, target=None):
                if name == "jax" or name.startswith(("jax.", "jaxlib")):
                    raise ImportError(f"No module named {name!r} (blocked for the test)")
                return None

        sys.meta_path.insert(0, _NoJax())
    """))
    script = textwrap.dedent(f"""
        import numpy as np
        import kiln
        import kiln.xla
        data = open({str(zoo.path("mlp"))!r}, "rb").read()
        it = kiln.Interpreter(model_content=data)
        it.allocate_tensors()
        it.invoke()
        for make in (lambda: kiln.xla.XlaDelegate(), lambda: kiln.xla.to_jax(data)):
            try:
                make()
            except kiln.KilnError as exc:
                assert "pip install 'kiln[xla]'" in str(exc), exc
            else:
                raise SystemExit("no error without jax")
        print("ok")
    """)
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(repo)]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_cli_benchmark_and_run_with_the_xla_delegate(capsys, zoo):
    from tests.test_cli import kiln_cli

    model = str(zoo.path("mobilenet"))
    code, out, _ = kiln_cli(capsys, "benchmark", model, "--runs", 3, "--delegate", "xla")
    assert code == 0 and "delegate: xla" in out and "xla delegate (67 nodes)" in out
    assert "XLA trace + compile" in out and "67 nodes claimed, 0 left on the reference kernels" in out
    code, out, _ = kiln_cli(capsys, "run", model, "--delegate", "xla")
    assert code == 0 and "output_0" in out


@pytest.mark.parametrize("divisor", [255.0, 0.1, 3.0, 7.3e-3])
def test_division_by_a_constant_is_the_float32_quotient(divisor):
    """XLA would turn x / constant into x * (1 / constant), one ulp off LiteRT for about a sixth of
    all values; the lowering divides exactly, so the outputs are LiteRT's bit for bit."""
    from tests.harness import Const, single_op_model

    x = np.random.default_rng(3).uniform(-1000, 1000, 20000).astype(np.float32)
    model = single_op_model("DIV", [x, Const(np.array([divisor], np.float32))])
    delegate = XlaDelegate()
    got = feed(kiln.Interpreter(model_content=model, experimental_delegates=[delegate]), [x])[0]
    assert [op for _, op, _ in delegate.claimed] == ["DIV"]
    np.testing.assert_array_equal(got, feed(litert(model), [x])[0])
    np.testing.assert_array_equal(got, x / np.float32(divisor))
