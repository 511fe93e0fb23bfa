"""``min_runtime_version`` is recomputed wherever kiln writes a model that carries it."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln.format import read_model, write_model
from kiln.format.runtime_version import model_runtime_version
from kiln.ops.record import UNLISTED
from tests.harness import Const, single_op_model


def _min_runtime(data: bytes) -> str:
    return read_model(data).metadata["min_runtime_version"].rstrip(b"\0").decode()


def _fc_model(units: int = 32, depth: int = 64) -> bytes:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, depth)).astype(np.float32)
    w = Const(rng.standard_normal((units, depth)).astype(np.float32))
    b = Const(rng.standard_normal(units).astype(np.float32))
    model = read_model(single_op_model("FULLY_CONNECTED", [x, w, b]))
    model.metadata["min_runtime_version"] = b"1.5.0" + b"\0" * 11   # what TF writes for FC v1
    return write_model(model)


def test_the_writer_recomputes_a_stale_value():
    model = read_model(_fc_model())
    model.metadata["min_runtime_version"] = b"9.9.9" + b"\0" * 11
    assert _min_runtime(write_model(model)) == "1.5.0"


def test_a_model_without_the_entry_is_written_without_it():
    model = read_model(single_op_model("ADD", [np.ones(3, np.float32), np.ones(3, np.float32)]))
    assert "min_runtime_version" not in read_model(write_model(model)).metadata


@pytest.mark.parametrize("mode,expected", [("int8", "1.14.0"), ("int16x8", "1.15.0"), ("dynamic", "1.14.0"),
                                           ("weight_only", "2.7.0")])
def test_kiln_quantize_states_what_its_ops_need(mode, expected):
    """FC v1 needs 1.5.0; its int8 form (v4) 1.14.0, a 16x8 model's int16 QUANTIZE (v2) 1.15.0,
    hybrid FC with asymmetric inputs 1.14.0+, a per-channel DEQUANTIZE of int8 weights (v5)
    2.7.0 — kiln.quantize used to keep the float model's 1.5.0."""
    data = _fc_model()
    samples = [np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32) for i in range(4)]
    out = kiln.quantize(data, mode, representative_dataset=(lambda: ([s] for s in samples)) if mode.startswith("int")
                        else None, progress=False)
    value = _min_runtime(out)
    assert value == model_runtime_version(read_model(out))
    assert tuple(map(int, value.split("."))) >= tuple(map(int, expected.split("."))), value


def test_a_float_model_quantized_without_metadata_gains_it():
    model = read_model(_fc_model())
    del model.metadata["min_runtime_version"]
    out = kiln.quantize(write_model(model), "dynamic")
    assert _min_runtime(out) != ""


def test_pad_v5_has_litert_s_runtime_version():
    """PAD / PADV2 v5 (bool) need LiteRT 2.20.0, as TF 2.21 writes."""
    assert ops.require("PAD").runtime_version(5) == "2.20.0"
    assert ops.require("PADV2").runtime_version(5) == "2.20.0"


#: The (op, version) pairs LiteRT's runtime_version.cc (TensorFlow master, 2026) has no row for;
#: TF's converter skips them too. A new UNLISTED entry must be added here deliberately.
UNLISTED_PAIRS = {
    ("ASSIGN_VARIABLE", 2), ("BROADCAST_TO", 1), ("BROADCAST_TO", 4), ("CAST", 9), ("CONCATENATION", 6),
    ("CONCATENATION", 7), ("COS", 2), ("FILL", 5), ("GATHER", 8), ("GATHER_ND", 6), ("GELU", 3), ("PACK", 5),
    ("PAD", 6), ("PADV2", 6), ("REVERSE_V2", 4), ("SIN", 2), ("SLICE", 8), ("SOFTMAX", 4), ("SPLIT", 5),
    ("SPLIT_V", 3), ("TRANSPOSE", 9), ("UNPACK", 6),
}


def test_every_version_without_a_litert_row_is_a_known_one():
    found = {(name, v + 1) for name, record in ops.OPS.items()
             for v, value in enumerate(record.runtime_versions) if value == UNLISTED}
    assert found == UNLISTED_PAIRS
