"""Compiled partitions exported next to the .tflite (kiln/xla/exported.py, issue #33 item 6):
loaded back bit-identical to the traced path without tracing; a stale or foreign export is
ignored with one warning; a second process starts from it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import kiln  # noqa: E402
import kiln.runtime  # noqa: E402
import kiln.xla.delegate  # noqa: E402
from kiln.cli import main as kiln_main  # noqa: E402
from kiln.xla import XlaDelegate, export_model  # noqa: E402
from tests.harness import feed  # noqa: E402
from tests.runtime.zoo import sample_inputs  # noqa: E402


def _model(zoo, tmp_path, name) -> Path:
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(zoo.bytes(name))
    return path


def _answers(path, batch_sizes=None, **kw) -> tuple[XlaDelegate, list]:
    """A fresh interpreter's outputs for two inputs per batch size (one, without buckets)."""
    delegate = XlaDelegate(batch_sizes=batch_sizes, **kw)
    interp = kiln.Interpreter(model_path=str(path), experimental_delegates=[delegate])
    outs = [feed(interp, sample_inputs(interp.get_input_details(), seed, batch=b))
            for seed in (0, 1) for b in (batch_sizes or [None])]
    return delegate, outs


@pytest.fixture
def no_tracing(monkeypatch):
    """Tracing a partition raises: what runs must come from the export."""
    def refuse(*args, **kwargs):
        raise AssertionError("a partition was traced")

    monkeypatch.setattr(kiln.xla.delegate.XlaPartitionKernel, "_trace_fn", refuse)


@pytest.mark.parametrize("name, options", [
    ("mobilenet", {"weights": "arguments"}),  # 1x1 filters transposed, depthwise taps stored
    ("transformer", {"weights": "arguments", "dtype_policy": "bfloat16"}),  # weights transposed and cast
    ("lstm", {}),  # states in variable tensors, weights as literals (CPU, small)
    ("dynamic_batch", {"batch_sizes": [2, 8]}),  # a program per bucket
])
def test_round_trip_is_bit_identical_and_never_traces(zoo, tmp_path, request, name, options):
    path = _model(zoo, tmp_path, name)
    written = export_model(path, **options)
    assert written == str(path) + ".xla"
    with zipfile.ZipFile(written) as z:
        manifest = json.loads(z.read("manifest.json"))
        programs = sum(len(p["entries"]) for p in manifest["partitions"])
        weights = [w for p in manifest["partitions"] for e in p["entries"] for w in e["weights"]]
    assert programs == len(options.get("batch_sizes", [None])) and not manifest["skipped"]
    if options.get("weights") == "arguments":  # weights are read from the model, not copied into the export
        assert weights and sum("tensor" in w for w in weights) > len(weights) // 2
        assert manifest["stored_weight_bytes"] < 0.1 * path.stat().st_size
    batch_sizes = options.pop("batch_sizes", None)
    _, traced = _answers(path, batch_sizes, **options)
    request.getfixturevalue("no_tracing")
    delegate, loaded = _answers(path, batch_sizes, export=written, **options)
    assert delegate.from_export == programs
    for want, got in zip(traced, loaded):
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def _rewrite(path: Path, out: Path, **changes) -> Path:
    """A copy of an export with manifest fields changed (a member given as bytes: replaced)."""
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(out, "w") as w:
        manifest = json.loads(z.read("manifest.json"))
        manifest.update({k: v for k, v in changes.items() if not isinstance(v, bytes)})
        w.writestr("manifest.json", json.dumps(manifest))
        for member in z.namelist():
            if member != "manifest.json":
                w.writestr(member, next((v for k, v in changes.items() if isinstance(v, bytes) and member.startswith(k)),
                                        z.read(member)))
    return out


def test_stale_foreign_or_broken_exports_are_ignored_with_one_warning(zoo, tmp_path, caplog):
    path = _model(zoo, tmp_path, "dynamic_batch")
    export = Path(export_model(path, batch_sizes=[2]))
    other = _model(zoo, tmp_path, "mlp")
    garbage = tmp_path / "garbage.xla"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    cases = {
        "model_sha256": (other, export, {"batch_sizes": None}),  # another model's bytes
        "dtype_policy": (path, export, {"dtype_policy": "bfloat16"}),
        "platform": (path, _rewrite(export, tmp_path / "tpu.xla", platform="tpu"), {}),
        "kiln": (path, _rewrite(export, tmp_path / "old.xla", kiln="0.0.1"), {}),
        "cannot read it": (path, garbage, {}),
        "cannot load the program": (path, _rewrite(export, tmp_path / "bad.xla", programs=b"\x00" * 64), {}),
    }
    for why, (model, file, options) in cases.items():
        caplog.clear()
        batch_sizes = options.pop("batch_sizes", [2])
        _, want = _answers(model, batch_sizes, **options)
        with caplog.at_level(logging.WARNING, logger="kiln.xla"):
            delegate, got = _answers(model, batch_sizes, export=file, **options)
        assert delegate.from_export == 0
        lines = [r.getMessage() for r in caplog.records if r.name == "kiln.xla"]
        assert len(lines) == 1 and why in lines[0] and str(file) in lines[0], (why, lines)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a[0], b[0])
    with pytest.raises(kiln.KilnError, match="is not a file"):
        XlaDelegate(export=tmp_path / "missing.xla")


def test_cli_writes_it_and_runtime_open_finds_it_next_to_the_model(zoo, tmp_path, capsys, request):
    path = _model(zoo, tmp_path, "dynamic_batch")
    assert kiln_main(["xla-export", str(path), "--batch-sizes", "4,1"]) == 0
    out = capsys.readouterr().out
    assert f"{path}.xla" in out and "inputs [[1, 8, 8, 3]], [[4, 8, 8, 3]]" in out
    x = sample_inputs(kiln.Interpreter(model_path=str(path)).get_input_details(), 0, batch=3)[0]
    want = feed(kiln.Interpreter(model_path=str(path)), [x])[0]
    request.getfixturevalue("no_tracing")
    served = kiln.runtime.open(path, "xla", batch_sizes=[1, 4])
    runner = served.new_runner()
    signature = served.signature()
    (name,) = signature.inputs
    got = runner.run(signature.key, {name: x})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(SystemExit, match="2"):
        kiln_main(["xla-export", str(path), "--batch-sizes", "0"])
    assert "batch sizes are positive ints" in capsys.readouterr().err


_FRESH_PROCESS = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import numpy as np
    import kiln, kiln.xla.delegate as D
    traces = []
    trace = D.XlaPartitionKernel._trace_fn
    D.XlaPartitionKernel._trace_fn = lambda *a, **k: traces.append(1) or trace(*a, **k)
    d = D.XlaDelegate(weights="arguments", export=sys.argv[2] if len(sys.argv) > 2 else None)
    it = kiln.Interpreter(model_path=sys.argv[1], experimental_delegates=[d])
    it.allocate_tensors()
    for t in it.get_input_details():
        it.set_tensor(t["index"], np.full(t["shape"], 0.5, t["dtype"]))
    it.invoke()
    out = it.get_tensor(it.get_output_details()[0]["index"])
    print(json.dumps({"seconds": time.perf_counter() - start, "traces": len(traces), "out": out.tolist()}))
""")


def test_a_second_process_loads_the_export_without_tracing(zoo, tmp_path):
    """A fresh process with an empty compile cache: the export's programs are compiled, never traced."""
    path = _model(zoo, tmp_path, "mobilenet")
    export = export_model(path, weights="arguments")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KILN_XLA_CACHE": str(tmp_path / "cache")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = {}
    for mode, args in (("traced", [str(path)]), ("export", [str(path), export])):
        proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, *args], env={
            **env, "KILN_XLA_CACHE": str(tmp_path / f"cache-{mode}")}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"time to first answer, fresh process, empty compile cache: traced {runs['traced']['seconds']:.2f} s, "
          f"from the export {runs['export']['seconds']:.2f} s")
    assert runs["traced"]["traces"] >= 1 and runs["export"]["traces"] == 0
    assert runs["traced"]["out"] == runs["export"]["out"]
