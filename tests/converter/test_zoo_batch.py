"""Every zoo model whose batch is free runs correctly in LiteRT at other batch sizes.

LiteRT sizes some tensors once (variable tensors live in a persistent arena allocated at the
first `allocate_tensors`), so a model can be right at the batch it was first allocated with
and wrong — or corrupt the heap — after `resize_tensor_input`. Each model runs in its own
process through batches 1, 3, 2, 3 on one interpreter; a crash fails its test only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.converter import zoo
from tests.converter.test_zoo import assert_matches

BATCHES = (1, 3, 2, 3)

_LITERT_SCRIPT = r"""
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter

model_path, key, feeds_path, out_path = sys.argv[1:]
feeds = np.load(feeds_path)
runner = Interpreter(model_path=model_path).get_signature_runner(key)
results = {}
for step in sorted({name.split("/")[0] for name in feeds.files}, key=int):
    inputs = {name.split("/", 1)[1]: feeds[name] for name in feeds.files if name.startswith(step + "/")}
    for name, value in runner(**inputs).items():
        results[f"{step}/{name}"] = value
np.savez(out_path, **results)
"""


def at_batch(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """``feeds`` with ``batch`` rows: the given rows cycled, each repeat rolled along its last
    axis so that no two rows are equal (and integer ids stay valid ids)."""
    out = {}
    for name, value in feeds.items():
        n = value.shape[0]
        rows = [value[i % n] if value.ndim < 2 else np.roll(value[i % n], i // n, axis=-1)
                for i in range(batch)]
        out[name] = np.stack(rows).astype(value.dtype)
    return out


def free_batch_signatures(case: zoo.Case) -> list[str]:
    """Signature keys of kiln's model whose every input has a free leading (batch) dim."""
    import kiln

    interp = kiln.Interpreter(model_content=case.kiln_model)
    keys = []
    for key in interp.get_signature_list():
        details = interp.get_signature_runner(key).get_input_details().values()
        if details and all(len(d["shape_signature"]) >= 1 and d["shape_signature"][0] == -1
                           for d in details):
            keys.append(key)
    return keys


def _named(case: zoo.Case, key: str, feeds: dict) -> dict:
    if "__first__" not in feeds:
        return feeds
    import kiln

    (name,) = kiln.Interpreter(model_content=case.kiln_model).get_signature_list()[key]["inputs"]
    return {name: feeds["__first__"]}


def run_litert_in_subprocess(model: bytes, key: str, steps: list[dict]) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="kiln_batch_") as tmp:
        model_path, feeds_path, out_path = (os.path.join(tmp, f) for f in ("m.tflite", "f.npz", "o.npz"))
        with open(model_path, "wb") as f:
            f.write(model)
        np.savez(feeds_path, **{f"{i}/{name}": v for i, feeds in enumerate(steps) for name, v in feeds.items()})
        proc = subprocess.run([sys.executable, "-c", _LITERT_SCRIPT, model_path, key, feeds_path, out_path],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (f"LiteRT failed (exit {proc.returncode}) running batches {BATCHES}:\n"
                                      f"{proc.stderr[-2000:]}")
        outs = np.load(out_path)
        return [{name.split("/", 1)[1]: outs[name] for name in outs.files if name.startswith(f"{i}/")}
                for i in range(len(steps))]


@pytest.mark.parametrize("name", zoo.params(zoo.BUILDERS))
def test_free_batch_runs_at_every_batch_in_litert_and_kiln(name):
    import kiln

    case = zoo.case(name)
    if case.source.run is None:
        pytest.skip("no TensorFlow reference at other shapes")
    keys = [k for k in free_batch_signatures(case) if k in case.source.feeds]
    if not keys:
        pytest.skip("no signature with a free batch dimension")
    for key in keys:
        steps = [at_batch(case.source.feeds[key], b) for b in BATCHES]
        references = [case.source.run(key, feeds) for feeds in steps]
        named = [_named(case, key, feeds) for feeds in steps]
        runner = kiln.Interpreter(model_content=case.kiln_model).get_signature_runner(key)
        for batch, feeds, ref, got in zip(BATCHES, named, references,
                                          run_litert_in_subprocess(case.kiln_model, key, named)):
            assert_matches(got, ref, f"{name} LiteRT at batch {batch}")
            assert_matches(runner(**feeds), ref, f"{name} kiln at batch {batch}")
