"""TensorFlow's own op versions for .tflite models: each model round-tripped through TF's MLIR
flatbuffer importer and exporter, which re-derives every operator code's version with LiteRT's
op_version.cc and the ``min_runtime_version`` metadata with runtime_version.cc.

Run as ``python -m tests.quant.tf_op_versions IN_DIR OUT_DIR``: for each ``IN_DIR/<name>.tflite``
it writes ``OUT_DIR/<name>.tflite`` (TF's model) or ``OUT_DIR/<name>.error`` (why TF refused it),
with ``OUT_DIR/<name>.started`` first, so the caller (`tf_round_trips`) can name a model on which
TF's converter crashed the process and go on with the rest in a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path


def main(in_dir: str, out_dir: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tensorflow.lite.python.convert import mlir_sparsify  # the exporter re-versions every op

    out = Path(out_dir)
    for path in sorted(Path(in_dir).glob("*.tflite")):
        if (out / f"{path.stem}.started").exists():
            continue
        (out / f"{path.stem}.started").touch()
        log = out / f"{path.stem}.log"
        try:
            with _stderr_to(log):  # MLIR's diagnostics go to fd 2, not into the exception
                (out / path.name).write_bytes(mlir_sparsify(path.read_bytes()))
        except Exception as exc:  # TF's converter raises its own error types
            said = [line for line in log.read_text(errors="replace").splitlines() if "error" in line]
            (out / f"{path.stem}.error").write_text(f"{type(exc).__name__}: {exc} {' '.join(said)}"[:2000])


@contextlib.contextmanager
def _stderr_to(path: Path):
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def tf_round_trips(models: dict[str, bytes], workdir: Path, timeout: float = 600) -> dict[str, bytes | str]:
    """TF's round trip of each model: its bytes, or a string saying why there is none."""
    src, dst = workdir / "in", workdir / "out"
    src.mkdir(parents=True, exist_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    for name, content in models.items():
        (src / f"{name}.tflite").write_bytes(content)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "3"}
    results: dict[str, bytes | str] = {}
    for _ in range(len(models) + 1):
        run = subprocess.run([sys.executable, "-m", "tests.quant.tf_op_versions", str(src), str(dst)], cwd=root,
                             env=env, capture_output=True, timeout=timeout)
        for name in models:
            if name in results or not (dst / f"{name}.started").exists():
                continue
            if (dst / f"{name}.tflite").exists():
                results[name] = (dst / f"{name}.tflite").read_bytes()
            elif (dst / f"{name}.error").exists():
                results[name] = "TF's MLIR importer refused it: " + (dst / f"{name}.error").read_text()
            else:
                results[name] = f"TF's converter crashed the process on it (exit status {run.returncode})"
        if run.returncode == 0 or len(results) == len(models):
            break
    for name in models:
        results.setdefault(name, "TF's round trip never reached it")
    return results


if __name__ == "__main__":
    main(*sys.argv[1:3])
