"""State through the XLA backend: resource variables and CALL_ONCE as carried state in
to_jax (against LiteRT's signature runners), the delegate's claim of them, and LSTM state
variables written by another node (kiln's conversions) inside one partition."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
from kiln import ops  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln.format import write_model  # noqa: E402
from kiln.ir import Model, Operator  # noqa: E402
from kiln.schema import Activation, DType  # noqa: E402
from kiln.xla import XlaDelegate, to_jax  # noqa: E402
from tests.harness import assert_close, feed  # noqa: E402
from tests.runtime.conftest import litert  # noqa: E402


def test_resource_variables_are_carried_state_in_to_jax(zoo):
    """accumulate twice, then read: the state threads through two signatures' functions."""
    data = zoo.bytes("variables")
    accumulate, params = to_jax(data, "accumulate")
    read, read_params = to_jax(data, "read")
    assert accumulate.stateful and read.stateful
    state = accumulate.initial_state()
    assert set(state) == {"total", "count"}
    ref = litert(data)
    rng = np.random.default_rng(3)
    step = jax.jit(accumulate)
    for _ in range(2):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        out, state = step(params, state, x)
        expected = ref.get_signature_runner("accumulate")(x=x)
        for name in expected:
            assert_close(np.asarray(out[name]), expected[name], what=f"accumulate/{name}")
    scale = rng.standard_normal((2, 3)).astype(np.float32)
    out, state = read(read_params, state, scale)
    assert_close(np.asarray(out["scaled"]), ref.get_signature_runner("read")(scale=scale)["scaled"])


def test_stateful_function_needs_a_state(zoo):
    accumulate, params = to_jax(zoo.bytes("variables"), "accumulate")
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KilnError, match="initial_state"):
        accumulate(params, x)
    with pytest.raises(KilnError, match="before any ASSIGN_VARIABLE"):
        accumulate(params, {}, x)


def test_delegate_claims_resource_variables(zoo):
    """The delegate reaches the interpreter's variable store (tests/xla/test_delegate_vars.py)."""
    data = zoo.bytes("variables")
    delegate = XlaDelegate()
    interp = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    x = np.ones((2, 3), np.float32)
    interp.get_signature_runner("accumulate")(x=x)
    claimed = {name for (_, name, _) in delegate.claimed}
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"} <= claimed
    assert not delegate.rejected, delegate.rejected


def _lstm_with_written_state(batch=2, time=4, n_in=3, n=5) -> bytes:
    """kiln's converter's pattern: FILL writes zeros into the state variables, the LSTM reads
    and updates them, an ADD reads the final cell state back after it."""
    rng = np.random.default_rng(9)
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (batch, time, n_in))
    sg.inputs.append(x)
    dims = np.array([batch, n], np.int32)
    h, c = (sg.add_tensor(name, DType.FLOAT32, (batch, n), is_variable=True) for name in ("h", "c"))
    for var in (h, c):
        fill = Operator("FILL")
        sg.add_operator(fill, [sg.add_constant(f"{var.name}_dims", dims),
                               sg.add_constant(f"{var.name}_zero", np.zeros((), np.float32))], [var])
    weights = [sg.add_constant(f"w{k}", (rng.standard_normal((n, n_in if k < 4 else n)) * 0.4).astype(np.float32))
               for k in range(8)]
    biases = [sg.add_constant(f"b{k}", (rng.standard_normal(n) * 0.1).astype(np.float32)) for k in range(4)]
    y = sg.add_tensor("y", DType.FLOAT32, (batch, time, n))
    lstm = Operator("UNIDIRECTIONAL_SEQUENCE_LSTM", options={"fused_activation_function": Activation.TANH})
    sg.add_operator(lstm, [x, *weights, None, None, None, *biases, None, None, h, c, None, None, None, None], [y])
    cell = sg.add_tensor("final_cell", DType.FLOAT32, (batch, n))
    sg.add_operator(Operator("ADD"), [c, sg.add_constant("zero", np.zeros((), np.float32))], [cell])
    sg.outputs.extend([y, cell])
    for op in sg.operators:
        op.version = ops.require(op.op_type).version(op)
    return write_model(model)


def test_lstm_state_written_by_another_node_is_claimed():
    data = _lstm_with_written_state()
    delegate = XlaDelegate()
    ours = kiln.Interpreter(model_content=data, experimental_delegates=[delegate])
    ref = kiln.Interpreter(model_content=data)
    rng = np.random.default_rng(1)
    for _ in range(2):  # the FILL restarts both from zeros on every invoke
        x = rng.standard_normal((2, 4, 3)).astype(np.float32)
        for a, e in zip(feed(ours, [x]), feed(ref, [x])):
            assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert not delegate.rejected, delegate.rejected
    assert len(delegate.kernels) == 1
