"""``kiln quantize ... --debug report.html`` and the debugger's page in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kiln.cli import main

tf = pytest.importorskip("tensorflow")

from kiln.quant.debug.report import CUMULATIVE_COLOR, LAYER_COLOR, WORST_COLOR  # noqa: E402
from kiln.quant.debug.debugger import QuantizationDebugger  # noqa: E402
from tests.inference.test_report_html import _png_pixels  # noqa: E402

from .test_debugger import broken_cnn, cnn  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture()
def files(tmp_path):
    float_model, _, data = cnn()
    model = tmp_path / "cnn.tflite"
    model.write_bytes(float_model)
    npz = tmp_path / "calib.npz"
    np.savez(npz, x=np.concatenate(data))   # keyed by the input's signature name
    return model, npz


def test_debug_writes_the_page_and_prints_the_worst_ops(files, tmp_path, capsys):
    model, npz = files
    page = tmp_path / "report.html"
    args = ["quantize", str(model), "-o", str(tmp_path / "q.tflite"), "--mode", "int8", "--data", str(npz),
            "--debug", str(page), "--debug-runner", "litert"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{page}: quantization debugger report over {len(np.load(npz)['x'])} samples" in out
    assert "top-1 agreement" in out and "ops adding the most error" in out
    worst = [line for line in out.splitlines() if line.startswith("    #")]
    assert len(worst) == 5 and all("'" in line for line in worst)
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count('class="bar layer"') == 7


def test_debug_needs_data(files, tmp_path, capsys):
    model, _ = files
    assert main(["quantize", str(model), "--mode", "dynamic", "--debug", str(tmp_path / "r.html")]) == 2
    assert "--debug needs --data" in capsys.readouterr().err


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_page_renders_in_headless_chromium(tmp_path):
    float_model, _, data = cnn()
    debugger = QuantizationDebugger(float_model, broken_cnn(), data, runner="litert")
    page = tmp_path / "debug.html"
    debugger.to_html(page)
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=900,660"]
    shot = tmp_path / "shot.png"
    subprocess.run(base + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (900, 660)
    count = {c: sum(px == _rgb(c) for row in rows for px in row) for c in (LAYER_COLOR, CUMULATIVE_COLOR, WORST_COLOR)}
    # The page is static (no script): the pixels show it renders. The broken convolution's
    # bar is the longest: thousands of pixels in the worst op's red.
    assert count[WORST_COLOR] > 2000 and count[LAYER_COLOR] > 100 and count[CUMULATIVE_COLOR] > 2000


def test_debug_target_prints_a_denylist_that_meets_it(files, tmp_path, capsys):
    model, npz = files
    first = tmp_path / "q.tflite"
    args = ["quantize", str(model), "-o", str(first), "--mode", "int8", "--data", str(npz),
            "--debug", str(tmp_path / "report.html"), "--debug-runner", "litert"]
    assert main(args) == 0
    error = float(capsys.readouterr().out.split("max |error| ")[1].split(",")[0])
    assert main(args + ["--debug-target", str(error / 2)]) == 0
    out = capsys.readouterr().out
    assert f"meets max |error| {error / 2:g}" in out
    denylist = out.split("--denylist ")[1].split()
    again = tmp_path / "again.tflite"   # the printed flags give a model that meets the target
    assert main(["quantize", str(model), "-o", str(again), "--mode", "int8", "--data", str(npz), "--denylist",
                 *denylist, "--debug", str(tmp_path / "again.html"), "--debug-runner", "litert"]) == 0
    printed = float(capsys.readouterr().out.split("max |error| ")[1].split(",")[0])   # 3 digits
    assert printed <= error / 2 * 1.005
    assert main(["quantize", str(model), "--mode", "int8", "--data", str(npz), "--debug-target", "0.1"]) == 2
    assert "--debug-target needs --debug" in capsys.readouterr().err
