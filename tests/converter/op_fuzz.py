"""The op fuzz: every sweep case (tests/converter/op_sweep.py) at every input dtype TensorFlow
accepts for it, converted by kiln and run in child processes (tests/converter/fuzz_child.py) in
LiteRT (default and BUILTIN_REF resolvers) and kiln (default and BUILTIN_REF): no file kiln
writes may kill a runtime (SIGABRT, SIGSEGV, ...) or hang it, and a conversion kiln refuses is
a `kiln.KilnError` that says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.converter import op_sweep

#: Every dtype the fuzz tries for a case's fuzzable inputs.
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "bool", "complex64", "complex128", "string")
#: A child that logs no progress for this long is hung on its current job.
HANG_SECONDS = 30.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Fuzz:
    """What one fuzz run found."""

    jobs: list = field(default_factory=list)          # [model path, feeds path, runtime]
    labels: list = field(default_factory=list)        # "case[dtype]" per job
    converted: list = field(default_factory=list)     # "case[dtype]" kiln converted
    refused: dict = field(default_factory=dict)       # "case[dtype]" -> kiln's reasons (KilnError)
    crashes: list = field(default_factory=list)       # kiln's converter raised a non-KilnError, or its
                                                      # report names a lowering the coverage misses
    deaths: list = field(default_factory=list)        # (label, runtime, how the child died)
    outcomes: dict = field(default_factory=dict)      # job index -> the child's outcome


def accepted(case, dtype: str | None):
    """(concrete function, feeds) when TensorFlow traces and runs ``case`` at ``dtype``, else None."""
    try:
        fn = op_sweep.concrete(case, dtype)
        values = op_sweep.feeds(case, dtype)
        op_sweep.eager(case, values)
    except Exception:  # noqa: BLE001 - TF turns the dtype down (at tracing or in its kernels)
        return None
    return fn, values


def convert_all(cases, workdir: Path, dtypes=DTYPES) -> Fuzz:
    """Convert every case at every accepted one of ``dtypes``; the runtime jobs of what kiln converts."""
    import kiln

    fuzz = Fuzz()
    for case in cases:
        for dtype in dtypes if any(i.fuzz for i in case.inputs) else (None,):
            got = accepted(case, dtype)
            if got is None:
                continue
            fn, values = got
            label = f"{case.name}[{dtype or 'own'}]"
            try:
                model, report = op_sweep.convert_kiln(fn)
            except kiln.KilnError as exc:  # the reasons: per unsupported op, else the message
                fuzz.refused[label] = getattr(exc, "details", None) or [str(exc)]
                continue
            except Exception as exc:  # noqa: BLE001 - a crash of kiln's converter is the finding
                fuzz.crashes.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            fuzz.crashes += [f"{label}: {why}" for why in op_sweep.undeclared_lowerings(report)]
            fuzz.converted.append(label)
            stem = workdir / f"{len(fuzz.converted):05d}"
            stem.with_suffix(".tflite").write_bytes(model)
            np.savez(stem.with_suffix(".npz"), *values)
            for runtime in op_sweep.RUNTIMES:
                fuzz.jobs.append([str(stem.with_suffix(".tflite")), str(stem.with_suffix(".npz")), runtime])
                fuzz.labels.append(label)
    return fuzz


def _read_log(path: Path) -> tuple[set[int], int | None, dict]:
    done, last, outcomes = set(), None, {}
    if path.exists():
        for line in path.read_text().splitlines():
            word, _, rest = line.partition(" ")
            if word == "start":
                last = int(rest)
            elif word == "done":
                index, _, text = rest.partition(" ")
                done.add(int(index))
                outcomes[int(index)] = json.loads(text)
    return done, last, outcomes


def run_all(fuzz: Fuzz, workdir: Path) -> Fuzz:
    """Run every job in child processes; a child that dies or hangs names its job (the last one
    it started), which is recorded, and the next child starts after it."""
    jobs_path, log_path = workdir / "jobs.json", workdir / "progress.log"
    jobs_path.write_text(json.dumps(fuzz.jobs))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    start = 0
    while start < len(fuzz.jobs):
        child = subprocess.Popen([sys.executable, "-m", "tests.converter.fuzz_child", str(jobs_path), str(log_path),
                                  str(start)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        size, moved = -1, time.monotonic()
        while child.poll() is None:
            time.sleep(0.05)
            now = log_path.stat().st_size if log_path.exists() else 0
            if now != size:
                size, moved = now, time.monotonic()
            elif time.monotonic() - moved > HANG_SECONDS:
                child.kill()
                child.wait()
                break
        done, last, outcomes = _read_log(log_path)
        fuzz.outcomes.update(outcomes)
        if child.returncode == 0:
            break
        culprit = last if last is not None and last not in done else None
        how = ("hung" if child.returncode == -signal.SIGKILL else
               f"killed by {signal.Signals(-child.returncode).name}" if child.returncode < 0 else
               f"exit status {child.returncode}")
        if culprit is None:  # died between jobs: nothing to blame, go on after the last one done
            culprit = max(done, default=start - 1)
            how += " (between jobs)"
        fuzz.deaths.append((fuzz.labels[culprit] if culprit < len(fuzz.labels) else "?",
                            fuzz.jobs[culprit][2] if culprit < len(fuzz.jobs) else "?", how))
        start = culprit + 1
    return fuzz
