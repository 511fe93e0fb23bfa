"""The child process of the op fuzz test (tests/converter/test_op_fuzz.py): runs converted files
in a runtime each and logs every step before and after it, so that the parent can name the
file and runtime that killed it (a signal) or hung, and start another child after it.

``python -m tests.converter.fuzz_child JOBS LOG START``: JOBS is a JSON list of
``[model path, feeds .npz path, runtime]``; LOG gets ``start <i>`` before job ``i`` and
``done <i> <json outcome>`` after it; jobs run from index START on.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def outcome(model: bytes, values: list, runtime: str) -> dict:
    """How one run ended: "ok", or the exception's type, message and whether it is a KilnError."""
    import kiln
    from tests.converter.op_sweep import run

    try:
        run(model, values, runtime)
    except Exception as exc:  # noqa: BLE001 - every kind is recorded for the parent to judge
        return {"error": type(exc).__name__, "message": str(exc)[:300], "kiln_error": isinstance(exc, kiln.KilnError)}
    return {"ok": True}


def main(argv: list[str]) -> int:
    import numpy as np

    jobs_path, log_path, start = argv[0], argv[1], int(argv[2])
    with open(jobs_path) as f:
        jobs = json.load(f)
    with open(log_path, "a", buffering=1) as log:
        for i in range(start, len(jobs)):
            model_path, feeds_path, runtime = jobs[i]
            log.write(f"start {i}\n")
            log.flush()
            os.fsync(log.fileno())
            with open(model_path, "rb") as f:
                model = f.read()
            with np.load(feeds_path, allow_pickle=True) as data:
                values = [data[f"arr_{k}"] for k in range(len(data.files))]
            log.write(f"done {i} {json.dumps(outcome(model, values, runtime))}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
