"""docs/support_matrix.md is what the backends' tables say (kiln/support_matrix.py), and the
tables do not drift apart: every (op, operand types) pair kiln's quantizer can write — the
records' quantization traits — is registered by every backend that runs the op at all, or
`TABLE_GAPS` names the pair and why. (Whether each backend's check passes on the nodes the
quantizer really writes: tests/quant/test_backend_drift.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import ops, support_matrix

ROOT = Path(__file__).resolve().parents[1]

#: (backend letter, op, operand types) -> why that backend runs the op but not these nodes.
#: Strict: a pair that becomes registered must leave this table. tests/quant/test_backend_drift.py
#: allows these refusals, and only these, on the quantizer's real nodes.
TABLE_GAPS: dict[tuple[str, str, str], str] = {}


@pytest.fixture
def tables():
    """The backends' tables (the XLA one needs JAX)."""
    pytest.importorskip("jax")
    return support_matrix.backend_tables()


def test_the_page_is_generated_from_the_tables(tables):
    page = ROOT / support_matrix.PAGE
    assert page.read_text() == support_matrix.render(), \
        f"{support_matrix.PAGE} is stale: run python -m kiln.support_matrix"


def test_check_mode_says_stale_or_current(tables, tmp_path):
    assert support_matrix.main(["--root", str(ROOT), "--check"]) == 0
    (tmp_path / "docs").mkdir()
    (tmp_path / support_matrix.PAGE).write_text("old\n")
    assert support_matrix.main(["--root", str(tmp_path), "--check"]) == 1


def test_every_pair_the_quantizer_writes_is_registered_by_each_backend_running_the_op(tables):
    gaps = {}
    for name, record in sorted(ops.OPS.items()):
        for key in sorted(support_matrix.quantizer_keys(record)):
            for letter, table in tables.items():
                if table.types_of(name) and (name, key) not in table:
                    gaps[letter, name, key] = sorted(map(str, table.types_of(name)))
    assert set(gaps) == set(TABLE_GAPS), (
        f"unlisted gaps: {sorted(set(gaps) - set(TABLE_GAPS))}; closed (remove them): "
        f"{sorted(set(TABLE_GAPS) - set(gaps))}")


def test_the_reference_kernels_run_every_pair_litert_has():
    """kiln's reference kernels are the floor every other backend falls back to."""
    missing = [(name, key) for name, record in sorted(ops.OPS.items())
               for key in support_matrix.litert_keys(record) if (name, key) not in ops.REFERENCE]
    assert missing == []
