"""A size guard: no module under kiln/ passes 700 lines, and the package stays within a line
budget (today's size plus room for the planned work: integer kernels, the bfloat16 stage,
serving). A module that grows past the limit is split along its seams, not waved through."""

from __future__ import annotations

from pathlib import Path

KILN = Path(__file__).resolve().parents[1] / "kiln"
MODULE_LIMIT = 700
PACKAGE_BUDGET = 40_000


def _sizes() -> dict[str, int]:
    return {str(p.relative_to(KILN.parent)): len(p.read_text(encoding="utf-8").splitlines())
            for p in sorted(KILN.rglob("*.py"))}


def test_every_module_is_under_the_limit():
    over = {name: n for name, n in _sizes().items() if n > MODULE_LIMIT}
    assert not over, f"modules over {MODULE_LIMIT} lines (split them along their seams): {over}"


def test_the_package_stays_within_its_budget():
    total = sum(_sizes().values())
    assert total <= PACKAGE_BUDGET, f"kiln/ has {total} lines, over the budget of {PACKAGE_BUDGET}"
