"""Measured latency of each placed function, before and after conversion, on the converting machine.

Costs in flops say where the work is, not whether the conversion pays: XLA's CPU backend runs
convolutions several times slower than TensorFlow's oneDNN kernels, and bfloat16 is slow on CPUs
without native support, so a model converted for an accelerator can be slower where it is
converted. Each accelerator function is timed at one batch size (the largest bucket of its batch op,
else ``ROWS``) with random inputs and the model's real variables: before, as the input model runs it
(TensorFlow's kernels, or XLA if it was jit-compiled already); after, as the converted model runs it
(XLA, with bfloat16 / int8 as converted). Rounds alternate between the two so a busy machine slows
both alike; the median per call is reported, plus the first call (compilation included).
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np

#: batch size of functions not batched by a BatchFunction
ROWS = 16
#: timing budget per function, seconds (a function slower than this gets 3 rounds of one call each)
BUDGET = 0.1
ROUNDS = 5
#: a first call slower than this (seconds) is the measurement: no repeated calls (compilation included)
SLOW = 5.0


class SlowerOnThisMachineWarning(UserWarning):
    """The converted functions run slower than the input's on the machine that converted them."""


def machine() -> str:
    """A short description of the converting machine (CPU model, cores, accelerators TensorFlow sees)."""
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    accelerators = sorted({d.device_type for d in tf.config.list_logical_devices()} - {"CPU"})
    return f"{cpu}, {os.cpu_count()} cores" + (f"; {', '.join(accelerators)}" if accelerators else "; no GPU/TPU")


def _inputs(specs, seed: int = 0) -> list:
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        if spec.dtype.is_floating:
            out.append(tf.constant(rng.standard_normal(spec.shape).astype(spec.dtype.as_numpy_dtype)))
        elif spec.dtype.is_integer:
            out.append(tf.constant(rng.integers(0, 10, spec.shape).astype(spec.dtype.as_numpy_dtype)))
        elif spec.dtype == tf.bool:
            out.append(tf.constant(rng.integers(0, 2, spec.shape).astype(bool)))
        else:
            out.append(tf.zeros(spec.shape, spec.dtype))
    return out


def _timed(fn, args) -> float:
    start = time.perf_counter()
    outs = fn(*args)
    for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
        o.numpy()
    return time.perf_counter() - start


def measure(before_runner, after_runner, pairs: list, rows_of) -> dict:
    """{after function: {"rows", "before_ms", "after_ms", "first_call_before_ms", "first_call_after_ms"}}.

    ``pairs``: (function in the input model, function in the converted model); ``rows_of(name)``: the
    batch size to time it at. A function that cannot be run alone is left out (with "error")."""
    import tensorflow as tf

    out = {}
    for before_name, after_name in pairs:
        rows = rows_of(after_name)
        try:
            call_b, specs_b = before_runner.arguments(before_name, rows)
            call_a, specs_a = after_runner.arguments(after_name, rows)
            before = tf.function(call_b, autograph=False)
            after = tf.function(call_a, autograph=False, jit_compile=True)
            args_b = _inputs(specs_b)
            args_a = args_b if [s.shape for s in specs_a] == [s.shape for s in specs_b] else _inputs(specs_a)
            first_b, first_a = _timed(before, args_b), _timed(after, args_a)  # compilation included
            if max(first_a, first_b) > SLOW:  # e.g. int8 convolutions on XLA's CPU backend: tens of seconds
                out[after_name] = {"rows": rows, "before_ms": round(1e3 * first_b, 2),
                                   "after_ms": round(1e3 * first_a, 2), "first_call_before_ms": round(1e3 * first_b, 2),
                                   "first_call_after_ms": round(1e3 * first_a, 2), "first_call_only": True}
                continue
            pair = _timed(before, args_b) + _timed(after, args_a)  # one more call each: caches, thread pools
            rounds = ROUNDS if pair < BUDGET else 3
            per_round = max(1, min(20, int(BUDGET / rounds / max(pair, 1e-5))))
            times_b, times_a = [], []
            for _ in range(rounds):  # alternate, so a busy machine slows both alike; best of each round
                times_b.append(min(_timed(before, args_b) for _ in range(per_round)))
                times_a.append(min(_timed(after, args_a) for _ in range(per_round)))
        except Exception as exc:  # noqa: BLE001 (timing is a report, never a failure)
            out[after_name] = {"rows": rows, "error": str(exc).strip().splitlines()[0] if str(exc).strip() else
                               type(exc).__name__}
            continue
        out[after_name] = {"rows": rows, "before_ms": round(1e3 * statistics.median(times_b), 4),
                           "after_ms": round(1e3 * statistics.median(times_a), 4),
                           "first_call_before_ms": round(1e3 * first_b, 2),
                           "first_call_after_ms": round(1e3 * first_a, 2)}
    return out


def slower(latency: dict) -> float | None:
    """after / before summed over the functions timed, when above 1.1 (None otherwise)."""
    timed = [v for v in latency.values() if "after_ms" in v]
    before = sum(v["before_ms"] for v in timed)
    after = sum(v["after_ms"] for v in timed)
    return after / before if timed and before > 0 and after > 1.1 * before else None
