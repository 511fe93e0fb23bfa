"""docs/serving.md and the README against ``kiln serve --help``: every flag the command takes is
documented, and every flag the docs name exists (the docs cannot drift from the parser)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kiln.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _serve_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt for action in sub.choices["serve"]._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


def _documented(text: str) -> set[str]:
    """Flags named in the tables' first column (`--flag ...` in backticks)."""
    flags = set()
    for line in text.splitlines():
        if line.startswith("| `--"):
            flags |= set(re.findall(r"(--[a-z_]+)", line.split("|")[1]))
    return flags


def test_serving_md_documents_every_flag_and_no_other():
    flags = _serve_flags()
    documented = _documented((ROOT / "docs" / "serving.md").read_text())
    assert flags - documented == set(), f"kiln serve flags missing from docs/serving.md: {sorted(flags - documented)}"
    assert documented - flags == set(), f"docs/serving.md names flags kiln serve lacks: {sorted(documented - flags)}"


def test_readme_names_only_real_serve_flags():
    readme = (ROOT / "README.md").read_text()
    named = set()
    for line in readme.splitlines():
        if "kiln serve" in line:
            named |= set(re.findall(r"(--[a-z_]+)", line))
    assert named and named <= _serve_flags(), sorted(named - _serve_flags())


def test_no_unfilled_placeholders():
    """The measured numbers are written in, not left as format fields."""
    for path in (ROOT / "README.md", ROOT / "docs" / "serving.md"):
        text = path.read_text()
        assert "%s" not in text and "%%" not in text, f"{path.name} holds an unfilled %s / %%"
