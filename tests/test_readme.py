"""What README.md shows a newcomer works as shown: the custom-op snippet (also after the input
is resized) and the CLI list, whose one-line helps, flags and choices are the commands' own."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kiln.cli import build_parser
from tests.runtime.test_custom_ops import custom_model

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _python_block_after(heading: str) -> str:
    section = README[README.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_custom_op_snippet_runs_and_survives_a_resize(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sin.tflite").write_bytes(custom_model("Sin", None, out_shape=(4,), in_shape=(4,)))
    scope: dict = {}
    exec(_python_block_after("### Custom ops in plain Python"), scope)  # noqa: S102 - the README's own code
    interp = scope["interp"]
    for n in (4, 7, 2):  # the model's shape, then two resizes
        x = np.linspace(-2, 2, n).astype(np.float32)
        index = interp.get_input_details()[0]["index"]
        if n != 4:
            interp.resize_tensor_input(index, [n])
        interp.allocate_tensors()
        interp.set_tensor(index, x)
        interp.invoke()
        np.testing.assert_allclose(interp.get_tensor(interp.get_output_details()[0]["index"]), 2 * np.sin(x),
                                   rtol=1e-6)


def _readme_cli_entries() -> dict[str, tuple[str, str]]:
    """subcommand -> (the help comment above it, its synopsis) from the README's CLI block."""
    section = README[README.index("## CLI\n"):]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    entries, comment, current = {}, None, None
    for line in block.splitlines():
        if line.startswith("# "):
            comment, current = line[2:], None
        elif line.startswith("kiln "):
            current = line.split()[1]
            entries[current] = (comment, line)
        elif line.startswith(" ") and current:
            entries[current] = (entries[current][0], entries[current][1] + " " + line.strip())
    return entries


def test_cli_list_matches_the_commands_help():
    parser = build_parser(with_convert=True)
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    helps = {a.dest: a.help for a in sub._choices_actions}
    entries = _readme_cli_entries()
    assert set(entries) == set(sub.choices)
    for name, (comment, synopsis) in entries.items():
        assert comment == helps[name], f"README's line for kiln {name} differs from `kiln --help`"
        options = {opt: action for action in sub.choices[name]._actions for opt in action.option_strings}
        tokens = synopsis.replace("[", " ").replace("]", " ").split()
        for i, token in enumerate(tokens):
            if not token.startswith("-"):
                continue
            assert token in options, f"README: kiln {name} has no option {token}"
            action = options[token]
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            if following.startswith("{"):
                assert following.strip("{}").split(",") == list(action.choices), (name, token)
            elif action.metavar and re.fullmatch(r"[A-Z][A-Z_.=|A-Za-z]*", following):
                first = action.metavar.replace("[", " ").replace("]", " ").split()[0]   # "[SIGNATURE=]FILE"
                assert following == first, (name, token, following, action.metavar)


@pytest.mark.parametrize("needle", ["GiB", "minutes", "Chromium"])
def test_readme_states_install_size_suite_time_and_chromium(needle):
    section = README[README.index("## Two commands"):README.index("## Quick start")]
    assert needle in section
