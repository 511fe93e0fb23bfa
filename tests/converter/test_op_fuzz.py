"""No file kiln writes kills a runtime (tests/converter/op_fuzz.py): every sweep case at every
input dtype TensorFlow accepts for it is converted by kiln and run in child processes in LiteRT
(default and BUILTIN_REF resolvers) and kiln (default and BUILTIN_REF). A child that dies by a
signal or hangs names the file and runtime; kiln's converter refuses only with a KilnError that
says why, kiln's runtimes fail only with KilnErrors, and LiteRT runs every file kiln writes (an
operand type LiteRT's kernel does not take is refused at conversion, by the op records' `types`).

The fast lane fuzzes the ops whose integer kernels LiteRT reads as quantized (they aborted
LiteRT and kiln's default Interpreter); the slow lane fuzzes every case.
"""

from __future__ import annotations

import pytest

from tests.converter import op_fuzz, op_sweep

pytest.importorskip("tensorflow")
pytest.importorskip("ai_edge_litert")

#: Cases whose int8 / uint8 / int16 files aborted LiteRT (ADD, SUB, the comparisons) or
#: computed with a zero scale (MUL, MEAN, RELU), and the empty WHERE.
FAST = ("add", "sub", "less", "equal", "mul", "mean", "relu_int", "where_empty")


def _fuzz(names, tmp_path, dtypes=op_fuzz.DTYPES) -> op_fuzz.Fuzz:
    cases = op_sweep.cases()
    fuzz = op_fuzz.convert_all([cases[n] for n in names], tmp_path, dtypes)
    return op_fuzz.run_all(fuzz, tmp_path)


def _problems(fuzz: op_fuzz.Fuzz) -> list[str]:
    problems = [f"{label} in {runtime}: {how}" for label, runtime, how in fuzz.deaths]
    problems += [f"kiln's converter crashed: {c}" for c in fuzz.crashes]
    problems += [f"{label}: kiln refused it without saying why: {reasons}" for label, reasons in fuzz.refused.items()
                 if not reasons or any(len(r.partition(": ")[2]) < 10 for r in reasons)]
    for index, outcome in sorted(fuzz.outcomes.items()):
        runtime = fuzz.jobs[index][2]
        if runtime.startswith("kiln") and "error" in outcome and not outcome["kiln_error"]:
            problems.append(f"{fuzz.labels[index]} in {runtime}: {outcome['error']} (not a KilnError): "
                            f"{outcome['message'][:200]}")
        if runtime == "litert" and "error" in outcome:  # (BUILTIN_REF has no float16 kernels)
            problems.append(f"{fuzz.labels[index]}: LiteRT refuses kiln's file: {outcome['message'][:200]}")
    missing = set(range(len(fuzz.jobs))) - set(fuzz.outcomes) - {
        i for i, label in enumerate(fuzz.labels) for d in fuzz.deaths if (label, fuzz.jobs[i][2]) == d[:2]}
    problems += [f"{fuzz.labels[i]} in {fuzz.jobs[i][2]}: never ran" for i in sorted(missing)]
    return problems


def test_integer_kernels_litert_reads_as_quantized(tmp_path):
    fuzz = _fuzz(FAST, tmp_path, ("int8", "uint8", "int16"))
    assert _problems(fuzz) == []
    # kiln refuses int8 ADD (as TF does), and converts what LiteRT runs on the codes (int8 Relu)
    assert "add[int8]" in fuzz.refused and "relu_int[int8]" in fuzz.converted
    assert any("no quantization parameters" in r for r in fuzz.refused["add[int8]"])


@pytest.mark.slow
def test_no_file_kiln_writes_kills_a_runtime(tmp_path):
    fuzz = _fuzz(sorted(op_sweep.cases()), tmp_path)
    assert _problems(fuzz) == []
    assert len(fuzz.converted) > 1000
