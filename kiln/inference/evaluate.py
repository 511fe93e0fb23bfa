"""Measured accuracy of a stage: the model before and after, run in TensorFlow on the same inputs.

Each state of the in-memory model is written to a scratch SavedModel (its ``saved_model.pb``;
variables and assets linked, not copied) and loaded with ``tf.saved_model.load``, so what is
measured is what TensorFlow serves, XLA placement included. Errors are per signature and output:
the largest absolute difference and that divided by the largest magnitude of the reference.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np

from ..errors import KilnError

#: batch sizes of the generated samples: not powers of two, so I/O shape padding is exercised; few,
#: since each new shape is one more XLA compilation per measured model
GENERATED_ROWS = (3, 5)


def generated_inputs(signature_def, seed: int = 0) -> list[dict]:
    """Inputs when no dataset is given, GENERATED_ROWS rows: standard normal floats, integers 1-9,
    random booleans, empty strings (a model that cannot run them is reported as not measured)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    out = []
    for rows in GENERATED_ROWS:
        feeds = {}
        for key, info in signature_def.inputs.items():
            dims = [rows] if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
            shape = [rows if i == 0 and d < 0 else (1 if d < 0 else d) for i, d in enumerate(dims)]
            dtype = tf.dtypes.as_dtype(info.dtype)
            if dtype.is_floating:
                feeds[key] = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
            elif dtype.is_integer:  # small ids, valid for most vocabularies; not 0 (padding id, masked-out)
                feeds[key] = rng.integers(1, 10, shape).astype(dtype.as_numpy_dtype)
            elif dtype == tf.bool:
                feeds[key] = rng.integers(0, 2, shape).astype(bool)
            elif dtype == tf.string:
                feeds[key] = np.full(shape, b"", dtype=object)
            else:
                feeds[key] = np.zeros(shape, dtype=dtype.as_numpy_dtype)
        out.append(feeds)
    return out


def snapshot(model, directory) -> str:
    """Write the in-memory model's saved_model.pb next to links to its variables and assets."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    proto = type(model.proto)()
    proto.CopyFrom(model.proto)
    # batch ops sharing a shared_name across loads in one process swap results (inference.md E1e)
    for meta in proto.meta_graphs:
        nodes = list(meta.graph_def.node) + [n for f in meta.graph_def.library.function for n in f.node_def]
        for node in nodes:
            if node.op == "BatchFunction":
                node.attr["shared_name"].s += f"/eval-{path.name}-{uuid.uuid4().hex[:6]}".encode()
    (path / "saved_model.pb").write_bytes(proto.SerializeToString())
    for sub in ("variables", "assets"):
        if (model.path / sub).exists():
            os.symlink((model.path / sub).resolve(), path / sub)
    return str(path)


def run(model_dir: str, key: str, samples: list[dict]) -> list[dict]:
    """Outputs of signature ``key`` for each sample (numpy), in TensorFlow."""
    result = run_all(model_dir, {key: samples})[key]
    if isinstance(result, Exception):
        raise result
    return result


def run_all(model_dir: str, inputs: dict) -> dict:
    """signature -> outputs per sample, or the exception it raised; the model is loaded once."""
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    out = {}
    for key, samples in inputs.items():
        fn = loaded.signatures[key]
        specs = fn.structured_input_signature[1]
        try:
            results = []
            for sample in samples:
                feeds = {name: tf.constant(np.asarray(sample[name]), dtype=spec.dtype)
                         for name, spec in specs.items() if name in sample}
                results.append({k: v.numpy() for k, v in fn(**feeds).items()})
            out[key] = results
        except Exception as exc:  # noqa: BLE001 (TF raises many kinds; callers decide)
            out[key] = exc
    return out


def compare(reference: list[dict], other: list[dict]) -> dict:
    """{output: {"max_abs": ..., "max_rel": ...}} over every sample (float outputs only)."""
    out = {}
    for ref, got in zip(reference, other):
        for name, a in ref.items():
            a = np.asarray(a)
            if a.dtype.kind not in "fc":
                same = np.array_equal(a, np.asarray(got[name]))
                entry = out.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "exact": True})
                entry["exact"] = entry["exact"] and same
                continue
            b = np.asarray(got[name], dtype=np.float64)
            diff = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
            scale = float(np.max(np.abs(a))) if a.size else 0.0
            entry = out.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "scale": 0.0})
            entry["max_abs"] = max(entry["max_abs"], diff)
            entry["scale"] = max(entry["scale"], scale)
    for entry in out.values():
        if "scale" in entry:
            entry["max_rel"] = entry["max_abs"] / entry["scale"] if entry["scale"] else entry["max_abs"]
    return out


class StageError(KilnError, RuntimeError):
    """A stage produced a model that fails where the model before it runs."""


def on_generated(m: dict) -> str:
    """A note for a refusal measured on generated inputs (they may mean nothing to the model)."""
    if m.get("source") != "generated inputs":
        return ""
    return (" (measured on generated inputs, which may not be valid for this model, e.g. an attention mask: give "
            "real inputs with --evaluation_data / evaluation_data= to measure on them)")


def _first_line(exc: Exception) -> str:
    """The line that says what went wrong (TensorFlow's graph errors open with a traceback)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith((" ", "\t", "Graph execution error", "Detected at node",
                                                          "<stack traces unavailable>"))]
    return (said or lines or [type(exc).__name__])[0].strip()


def measure(before_dir, after_dir: str, inputs: dict, stage: str, remedy: str, reference=None,
            runner=None) -> tuple:
    """({signature: {"samples": n, "source": ..., "outputs": compare(...)}}, outputs after the stage).

    ``reference``: outputs of the model before, already computed (the previous stage's ``after``),
    used instead of running ``before_dir``; ``runner(after_dir, {key: samples})`` runs the model after
    (default ``run_all``: one request at a time). A signature the model before cannot run on these inputs
    is recorded as not measured. Raises StageError when the model after the stage fails where the
    one before runs: a broken conversion is never written."""
    result, after = {}, {}
    known = {k: reference[k] for k in inputs if reference and k in reference}
    missing = {k: samples for k, (samples, _) in inputs.items() if k not in known}
    before = {**known, **(run_all(str(before_dir), missing) if missing else {})}
    runnable = {k: inputs[k][0] for k in inputs if not isinstance(before[k], Exception)}
    got_all = (runner or run_all)(after_dir, runnable) if runnable else {}
    for key, (samples, source) in sorted(inputs.items()):
        ref = before[key]
        if isinstance(ref, Exception):  # e.g. generated ids out of an embedding's range
            result[key] = {"samples": len(samples), "rows": _rows(samples), "source": source,
                           "error": _first_line(ref)}
            continue
        got = got_all[key]
        if isinstance(got, Exception):
            raise StageError(f"{stage}: signature {key!r} fails after the stage on inputs the model before it runs: "
                             f"{_first_line(got)}; {remedy}") from None
        after[key] = got
        result[key] = {"samples": len(samples), "rows": _rows(samples), "source": source,
                       "outputs": compare(ref, got)}
    return result, after


def _rows(samples: list) -> int:
    """Input rows over all samples (dimension 0 of the first input; 1 for a scalar)."""
    total = 0
    for sample in samples:
        first = np.asarray(next(iter(sample.values()))) if sample else np.zeros(())
        total += int(first.shape[0]) if first.ndim else 1
    return total


class Scratch:
    """A temporary directory for snapshots, removed on exit."""

    def __enter__(self):
        self.path = Path(tempfile.mkdtemp(prefix="kiln-eval-"))
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)

    def snapshot(self, model, name: str) -> str:
        return snapshot(model, self.path / name)


def summary(measured: dict) -> list[str]:
    """One report line per signature: the worst output."""
    lines = []
    for key, m in sorted(measured.items()):
        if "error" in m:
            lines.append(f"{key}: error not measured ({m['error']})")
            continue
        floats = {k: v for k, v in m["outputs"].items() if "scale" in v}
        if not floats:
            lines.append(f"{key}: no float outputs")
            continue
        worst = max(floats, key=lambda k: floats[k]["max_rel"])
        e = floats[worst]
        lines.append(f"{key}: max abs error {e['max_abs']:.3g}, max relative error {e['max_rel']:.3g} "
                     f"(output {worst!r}, {m.get('rows', m['samples'])} rows of {m['source']})")
    return lines
