"""Hostile files: every malformed model raises kiln.ModelError saying what is wrong and where.

Each case starts from a small valid model and breaks exactly one field; the error must
name the subgraph / tensor / operator / buffer concerned. The fuzz test at the end mutates
real zoo models at random and accepts only success or a KilnError — never a low-level
exception, a huge allocation or a hang.
"""

from __future__ import annotations

import re
import signal
import time
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.format import read_model, write_model
from kiln.ir import Model
from kiln.schema import DType
from tests.format import hostile as H
from tests.format.hostile import patch, root, small_model

BASE = small_model()
N_BUFFERS = root(BASE).BuffersLength()


def tensor(data, i, sg=0):
    return root(data).Subgraphs(sg).Tensors(i)


def operator(data, i, sg=0):
    return root(data).Subgraphs(sg).Operators(i)


def rejects(data, pattern: str):
    """read_model must raise ModelError whose message matches ``pattern`` (a regex)."""
    with pytest.raises(kiln.ModelError) as info:
        read_model(data)
    assert re.search(pattern, str(info.value)), f"message {str(info.value)!r} does not match {pattern!r}"
    return str(info.value)


def test_base_model_is_valid():
    from tests.runtime.conftest import litert

    x = np.array([[1, 2, 3, 4]], np.float32)
    ref = litert(BASE)
    ref.allocate_tensors()
    ref.set_tensor(0, x)
    ref.invoke()
    ours = kiln.Interpreter(model_content=BASE)
    ours.allocate_tensors()
    ours.set_tensor(0, x)
    ours.invoke()
    np.testing.assert_allclose(ours.get_tensor(5), ref.get_tensor(5), rtol=1e-6)


# -- the file as a whole ---------------------------------------------------------------------

@pytest.mark.parametrize("keep", [0, 3, 7, 8, 24, len(BASE) // 2, len(BASE) - 9])
def test_truncated(keep):
    with pytest.raises(kiln.ModelError):
        read_model(BASE[:keep])


def test_wrong_identifier():
    rejects(b"\x1c\0\0\0TFL2" + BASE[8:], r"missing the 'TFL3' file identifier \(found b'TFL2'\)")


def test_root_offset_past_end():
    rejects(patch(BASE, 0, "I", len(BASE) + 100), r"root offset \d+ is past the end")


def test_not_bytes():
    with pytest.raises(kiln.ModelError, match="give a path or bytes"):
        read_model(12345)


def test_missing_file(tmp_path):
    with pytest.raises(kiln.ModelError, match="cannot read model file"):
        read_model(tmp_path / "nope.tflite")


def test_absurd_vector_length():
    pos = H.vector_len_pos(root(BASE).Subgraphs(0), H.SUBGRAPH_TENSORS)
    rejects(patch(BASE, pos, "I", 0x7FFFFFFF), r"subgraph 0: tensor list declares 2147483647 entries")


# -- tensors ---------------------------------------------------------------------------------

def test_tensor_buffer_out_of_range():
    pos = H.field_pos(tensor(BASE, 1), H.TENSOR_BUFFER)
    rejects(patch(BASE, pos, "I", 40),
            rf"subgraph 0, tensor 1: buffer 40 out of range \(model has {N_BUFFERS} buffers\)")


def test_buffer_too_small_for_its_tensor():
    pos = H.vector_pos(tensor(BASE, 1), H.TENSOR_SHAPE, 1)  # w: [3, 4] -> [3, 400]
    rejects(patch(BASE, pos, "i", 400),
            r"subgraph 0, tensor 1: buffer holds 48 bytes, the FLOAT32 tensor of shape \[3, 400\] needs 4800")


def test_absurd_shape():
    t = tensor(BASE, 0)  # x: [1, 4] -> [2**31 - 1, 2**31 - 1]
    data = patch(BASE, H.vector_pos(t, H.TENSOR_SHAPE, 0), "i", 2**31 - 1)
    data = patch(data, H.vector_pos(t, H.TENSOR_SHAPE, 1), "i", 2**31 - 1)
    rejects(data, r"subgraph 0, tensor 0: shape \[2147483647, 2147483647\] declares \d+ elements")


def test_negative_dimension():
    rejects(patch(BASE, H.vector_pos(tensor(BASE, 0), H.TENSOR_SHAPE, 1), "i", -3),
            r"subgraph 0, tensor 0: shape \[1, -3\] has a negative dimension")


def test_unknown_tensor_type():
    # The type field of x is absent (FLOAT32 is the default), so break y (tensor 3) via w's type slot.
    t = tensor(BASE, 2)
    if t._tab.Offset(H.TENSOR_TYPE):
        data = patch(BASE, H.field_pos(t, H.TENSOR_TYPE), "b", 99)
    else:  # writer omitted the default: make one by rewriting the IR with an INT32 constant
        model = read_model(BASE)
        model.main.tensors[2].dtype = DType.INT32
        model.main.tensors[2].data = np.array([1, 2, 3], np.int32)
        data = write_model(model)
        data = patch(data, H.field_pos(tensor(data, 2), H.TENSOR_TYPE), "b", 99)
    rejects(data, r"subgraph 0, tensor 2: unknown tensor type 99")


def test_rank_too_large():
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1,) * 17)
    sg.inputs = sg.outputs = [x]
    rejects(write_model(model), r"subgraph 0, tensor 0: shape has rank 17, more than kiln accepts")


def test_external_buffer_past_end():
    data = write_model(read_model(BASE), external_buffers=True)
    buf = root(data).Buffers(1)
    rejects(patch(data, H.field_pos(buf, H.BUFFER_OFFSET), "Q", len(data) - 8),
            r"buffer 1: data at offset \d+ with size 48 runs past the end")


# -- operators -------------------------------------------------------------------------------

def test_operator_input_out_of_range():
    pos = H.vector_pos(operator(BASE, 0), H.OPERATOR_INPUTS, 1)
    rejects(patch(BASE, pos, "i", 99),
            r"subgraph 0, operator 0: input tensor 99 out of range \(subgraph has 6 tensors\)")


def test_operator_negative_input():
    pos = H.vector_pos(operator(BASE, 1), H.OPERATOR_INPUTS, 0)
    rejects(patch(BASE, pos, "i", -7), r"subgraph 0, operator 1: input tensor -7 out of range")


def test_operator_output_out_of_range():
    pos = H.vector_pos(operator(BASE, 1), H.OPERATOR_OUTPUTS, 0)
    rejects(patch(BASE, pos, "i", 6), r"subgraph 0, operator 1: output tensor 6 out of range")


def test_tensor_written_twice():
    pos = H.vector_pos(operator(BASE, 1), H.OPERATOR_OUTPUTS, 0)
    rejects(patch(BASE, pos, "i", 3), r"subgraph 0, operator 1: output tensor 'y' is already written")


def test_opcode_index_out_of_range():
    pos = H.field_pos(operator(BASE, 1), H.OPERATOR_OPCODE_INDEX)
    rejects(patch(BASE, pos, "I", 7),
            r"subgraph 0, operator 1: opcode index 7 out of range \(model has 2 operator codes\)")


def test_unknown_builtin_code():
    oc = root(BASE).OperatorCodes(0)  # FULLY_CONNECTED (ADD's code 0 is the schema default, not stored)
    rejects(patch(BASE, H.field_pos(oc, H.OPCODE_BUILTIN), "i", 9999),
            r"operator code 0: unknown builtin operator code 9999")


def test_subgraph_input_out_of_range():
    pos = H.vector_pos(root(BASE).Subgraphs(0), H.SUBGRAPH_INPUTS, 0)
    rejects(patch(BASE, pos, "i", 1000), r"subgraph 0: input tensor 1000 out of range")


def test_signature_tensor_out_of_range():
    tm = root(BASE).SignatureDefs(0).Outputs(0)
    rejects(patch(BASE, H.field_pos(tm, H.TENSORMAP_INDEX), "I", 77),
            r"signature 0: tensor 77 out of range \(subgraph 0 has 6 tensors\)")


def test_metadata_buffer_out_of_range():
    md = root(BASE).Metadata(0)
    rejects(patch(BASE, H.field_pos(md, H.METADATA_BUFFER), "I", 500),
            rf"metadata 0: buffer 500 out of range \(model has {N_BUFFERS} buffers\)")


def test_read_before_write_is_found_when_planning():
    """A graph whose operator reads a tensor produced later is refused by the interpreter."""
    pos = H.vector_pos(operator(BASE, 0), H.OPERATOR_INPUTS, 0)  # FC reads 'out' instead of x
    interp = kiln.Interpreter(model_content=patch(BASE, pos, "i", 5))
    with pytest.raises(kiln.ModelError, match=r"subgraph 0, node 0 \(FULLY_CONNECTED\): reads tensor 5 "
                                              r"\('out'\) before any operator writes it"):
        interp.allocate_tensors()


# -- control flow ----------------------------------------------------------------------------

def _loop_model(cond_index: int, body_index: int, recursive_body: bool) -> bytes:
    """Subgraph 0 runs WHILE(cond, body); the body may itself call WHILE(cond, 0)."""
    model = Model()
    main, cond, body = (model.add_subgraph(n) for n in ("main", "cond", "body"))
    for sg in (main, cond, body):
        x = sg.add_tensor("x", DType.FLOAT32, (1,))
        sg.inputs = [x]
    y = main.add_tensor("y", DType.FLOAT32, (1,))
    main.add_operator("WHILE", main.inputs, [y],
                      options={"cond_subgraph_index": cond_index, "body_subgraph_index": body_index})
    main.outputs = [y]
    flag = cond.add_tensor("flag", DType.BOOL, (1,))
    zero = cond.add_constant("zero", np.zeros(1, np.float32))
    cond.add_operator("LESS", [cond.inputs[0], zero], [flag])
    cond.outputs = [flag]
    z = body.add_tensor("z", DType.FLOAT32, (1,))
    if recursive_body:
        body.add_operator("WHILE", body.inputs, [z], options={"cond_subgraph_index": 1, "body_subgraph_index": 0})
    else:
        body.add_operator("ADD", [body.inputs[0], body.add_constant("one", np.ones(1, np.float32))], [z])
    body.outputs = [z]
    return write_model(model)


def test_valid_loop_model_runs():
    interp = kiln.Interpreter(model_content=_loop_model(1, 2, recursive_body=False))
    interp.allocate_tensors()
    interp.set_tensor(0, np.array([-3.5], np.float32))
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(1), [0.5])


def test_cyclic_while_calls():
    rejects(_loop_model(1, 2, recursive_body=True),
            r"subgraph \d calls subgraph \d, which \(indirectly\) calls it back: cyclic subgraph calls")


def test_while_calling_itself():
    rejects(_loop_model(1, 0, recursive_body=False), r"subgraph 0 calls subgraph 0")


def test_while_subgraph_out_of_range():
    rejects(_loop_model(1, 9, recursive_body=False),
            r"subgraph 0, operator 0 \(WHILE\): body_subgraph_index 9 out of range \(model has 3 subgraphs\)")


def _if_chain(depth: int) -> bytes:
    """Subgraph i runs IF(true, then=i+1, else=i+1); the last one adds 1."""
    model = Model()
    sgs = [model.add_subgraph(f"level{i}") for i in range(depth)]
    for i, sg in enumerate(sgs):
        x, y = sg.add_tensor("x", DType.FLOAT32, (1,)), sg.add_tensor("y", DType.FLOAT32, (1,))
        sg.inputs, sg.outputs = [x], [y]
        if i + 1 < depth:
            sg.add_operator("IF", [sg.add_constant("c", np.array([True])), x], [y],
                            options={"then_subgraph_index": i + 1, "else_subgraph_index": i + 1})
        else:
            sg.add_operator("ADD", [x, sg.add_constant("one", np.ones(1, np.float32))], [y])
    return write_model(model)


def test_nested_calls_run_and_absurd_nesting_is_refused():
    from kiln.format.reader import MAX_CALL_DEPTH

    interp = kiln.Interpreter(model_content=_if_chain(MAX_CALL_DEPTH))
    interp.allocate_tensors()
    interp.set_tensor(0, np.array([2.0], np.float32))
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), [3.0])
    # 2000 levels would exhaust Python's stack (RecursionError); the reader refuses them first.
    rejects(_if_chain(2000), r"chain of \d+ nested subgraph calls, more than kiln accepts")


# -- fuzzing ---------------------------------------------------------------------------------

FUZZ_MODELS = ("mlp", "cnn", "control_flow", "variables", "dynamic_batch", "lstm")
BUDGET_S = 5.0


class _Hang(BaseException):
    """Raised by the alarm: a BaseException so no `except Exception` in kiln can swallow it."""


def _on_alarm(signum, frame):
    raise _Hang()


@pytest.fixture(scope="module")
def fuzz_corpus():
    from tests.runtime.zoo import zoo_bytes

    return {name: zoo_bytes(name) for name in FUZZ_MODELS}


def _load_and_run(data: bytes, delegate: bool = False) -> None:
    from kiln.delegates import NumpyDelegate

    model = read_model(data)
    interp = kiln.Interpreter(model_content=model, experimental_delegates=[NumpyDelegate()] if delegate else [])
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interp.get_input_details():
        dtype = np.dtype(d["dtype"])
        shape = tuple(int(s) for s in d["shape"])
        if dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iub":
            value = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            continue
        interp.set_tensor(d["index"], value)
    interp.invoke()
    for d in interp.get_output_details():
        interp.get_tensor(d["index"])


mutation = st.one_of(
    st.tuples(st.just("byte"), st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
    st.tuples(st.just("int32"), st.floats(0, 1, exclude_max=True),
              st.sampled_from([0, 1, -1, 2**31 - 1, -2**31, 0x10000, 255, 65536 * 64])),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True), st.just(0)),
)


@settings(max_examples=150, deadline=timedelta(seconds=BUDGET_S), derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(FUZZ_MODELS), mutations=st.lists(mutation, min_size=1, max_size=6),
       delegate=st.booleans())
def test_fuzzed_models_fail_cleanly(fuzz_corpus, monkeypatch, name, mutations, delegate):
    """Mutated zoo models either load and run, or raise a KilnError — in bounded time and memory."""
    from kiln.ops import control_flow
    from kiln.runtime import environment

    # Bound what a mutated shape or loop count may cost, so a "valid" hostile model cannot
    # stall the test machine: 64 MiB per tensor, 10k loop trips (both are documented knobs).
    monkeypatch.setattr(environment, "MAX_TENSOR_BYTES", 1 << 26)
    monkeypatch.setattr(control_flow, "MAX_WHILE_ITERATIONS", 10_000)
    data = bytearray(fuzz_corpus[name])
    for kind, where, value in mutations:
        pos = int(where * len(data))
        if kind == "byte":
            data[pos] = value
        elif kind == "int32":
            pos -= pos % 4
            if pos + 4 <= len(data):
                data[pos:pos + 4] = int(value).to_bytes(4, "little", signed=value < 0)
        else:
            del data[pos:]
            break
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 2 * BUDGET_S)  # hard stop; hypothesis' deadline is BUDGET_S
    start = time.perf_counter()
    try:
        _load_and_run(bytes(data), delegate)
    except kiln.KilnError:
        pass
    except _Hang:
        pytest.fail(f"{name} with mutations {mutations}: no result within {2 * BUDGET_S} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - start < 2 * BUDGET_S
