"""Where a porting user meets the tf.lite API's edges, kiln's Interpreter behaves as LiteRT's,
checked against ai-edge-litert side by side: num_threads, set_tensor / invoke before
allocate_tensors, signature-runner details, _get_op_details, _get_full_signature_list."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.errors import InterpreterError, KilnError
from kiln.format import write_model
from kiln.ir import Model, Signature
from kiln.schema import DType
from tests.runtime.conftest import litert


def _outcome(fn):
    """("ok", result) or (the LiteRT-visible exception kinds, message)."""
    try:
        return "ok", fn()
    except (ValueError, RuntimeError, TypeError) as exc:
        kinds = tuple(k.__name__ for k in (ValueError, RuntimeError, TypeError) if isinstance(exc, k))
        return kinds, str(exc)


@pytest.mark.parametrize("num_threads", [None, 1, 3, -1, 0, -2, 2.5, "2"])
def test_num_threads_accepted_and_refused_as_litert(zoo, num_threads):
    path = str(zoo.path("mlp"))
    theirs = _outcome(lambda: litert(path, num_threads=num_threads) and None)
    ours = _outcome(lambda: kiln.Interpreter(model_path=path, num_threads=num_threads) and None)
    assert ours[0] == theirs[0], (ours, theirs)
    if ours[0] != "ok":
        assert ours[1].split(",")[0] == theirs[1]     # LiteRT's words, then the value kiln got
        with pytest.raises(InterpreterError):
            kiln.Interpreter(model_path=path, num_threads=num_threads)


def test_set_tensor_and_invoke_before_allocate_tensors_as_litert(zoo):
    path = str(zoo.path("dynamic_batch"))
    lt, kn = litert(path), kiln.Interpreter(model_path=path)   # neither allocated
    (d,) = lt.get_input_details()
    x = np.zeros(d["shape"], np.float32)
    steps = [
        ("set before allocate", lambda i: i.set_tensor(d["index"], x)),
        ("invoke before allocate", lambda i: i.invoke()),
        ("allocate", lambda i: i.allocate_tensors()),
        ("set after allocate", lambda i: i.set_tensor(d["index"], x)),
        ("resize", lambda i: i.resize_tensor_input(d["index"], [2, *x.shape[1:]])),
        ("set the old shape after resize", lambda i: i.set_tensor(d["index"], x)),
        ("set the new shape before allocate", lambda i: i.set_tensor(d["index"], np.zeros((2, *x.shape[1:]),
                                                                                         np.float32))),
        ("invoke after resize", lambda i: i.invoke()),
        ("allocate again", lambda i: i.allocate_tensors()),
        ("set the new shape", lambda i: i.set_tensor(d["index"], np.zeros((2, *x.shape[1:]), np.float32))),
    ]
    for label, step in steps:
        theirs, ours = _outcome(lambda: step(lt)), _outcome(lambda: step(kn))
        # kiln's error is LiteRT's kind (and an InterpreterError, hence also a ValueError)
        assert (ours[0] == "ok") == (theirs[0] == "ok") and set(theirs[0]) <= set(ours[0]), (label, ours, theirs)
        if ours[0] != "ok":
            assert ours[1].startswith(theirs[1].split(".")[0]), (label, ours[1], theirs[1])  # LiteRT repeats it
    kn2 = kiln.Interpreter(model_path=path)
    with pytest.raises(KilnError):  # still a kiln error
        kn2.set_tensor(d["index"], x)
    with pytest.raises(RuntimeError):
        kn2.invoke()
    with pytest.raises(InterpreterError):
        kn2.invoke()


def test_signature_runner_details_name_the_tensors(zoo):
    for name in ("mobilenet", "variables"):
        path = str(zoo.path(name))
        lt, kn = litert(path), kiln.Interpreter(model_path=path)
        for key in lt.get_signature_list():
            theirs, ours = lt.get_signature_runner(key), kn.get_signature_runner(key)
            for kind in ("get_input_details", "get_output_details"):
                got = {k: (d["name"], d["index"]) for k, d in getattr(ours, kind)().items()}
                want = {k: (d["name"], d["index"]) for k, d in getattr(theirs, kind)().items()}
                assert got == want, (name, key, kind)


def test_full_signature_list_as_litert(zoo):
    for name in ("mobilenet", "variables", "mlp"):
        path = str(zoo.path(name))
        theirs = litert(path)._get_full_signature_list()
        ours = kiln.Interpreter(model_path=path)._get_full_signature_list()
        assert ours == theirs and [list(v["inputs"]) for v in ours.values()] == \
            [list(v["inputs"]) for v in theirs.values()]


def _model_with_an_omitted_operand() -> bytes:
    """FULLY_CONNECTED without a bias (operand -1): LiteRT lists no type for it."""
    model = Model()
    sg = model.add_subgraph("main")
    x = sg.add_tensor("x", DType.FLOAT32, (1, 4))
    w = sg.add_constant("w", np.ones((3, 4), np.float32))
    y = sg.add_tensor("y", DType.FLOAT32, (1, 3))
    sg.inputs, sg.outputs = [x], [y]
    sg.add_operator("FULLY_CONNECTED", [x, w, None], [y])
    model.signatures.append(Signature("serving_default", sg, {"x": x}, {"y": y}))
    return write_model(model)


@pytest.mark.parametrize("source", ["mobilenet", "omitted operand"])
def test_op_details_as_litert(zoo, source):
    data = _model_with_an_omitted_operand() if source != "mobilenet" else zoo.bytes("mobilenet")
    lt, kn = litert(data), kiln.Interpreter(model_content=data)
    theirs, ours = lt._get_ops_details(), kn._get_ops_details()
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert {k: a[k] for k in b if k not in ("inputs", "outputs")} == \
            {k: b[k] for k in b if k not in ("inputs", "outputs")}
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["outputs"], b["outputs"])
    assert kn._get_op_details(0)["op_name"] == lt._get_op_details(0)["op_name"]
    for bad in (len(theirs), -1):
        kind, _ = _outcome(lambda: lt._get_op_details(bad))
        with pytest.raises(InterpreterError, match="Invalid node index"):
            kn._get_op_details(bad)
        assert kind == ("ValueError",)
