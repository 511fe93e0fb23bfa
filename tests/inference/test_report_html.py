"""report.html renders in headless Chromium: a self-contained page with the cost bar chart."""

import shutil
import struct
import subprocess
import zlib

import pytest

tf = pytest.importorskip("tensorflow")

from kiln.inference import convert  # noqa: E402

from . import models  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
BAR_BLUE = (0x2F, 0x7E, 0xD8)


def _png_pixels(data: bytes):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8 and color in (2, 6)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_report_html_renders_bars_in_headless_chromium(tmp_path):
    src = models.save_two(tmp_path / "two")
    out = tmp_path / "out"
    convert(src, str(out), 'tpu_functions { function_alias: "func_a" } tpu_functions { function_alias: "func_b" }')
    page = out / "assets.extra" / "kiln" / "report.html"
    shot = tmp_path / "shot.png"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,900"]
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count('class="bar"') == 3  # [CPU cost] + two functions
    assert "Conversion Report" in dom and "serve_a" in dom and "Ops that stayed on the CPU" in dom
    subprocess.run(base + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True)
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 900)
    blue = [(x, y) for y, row in enumerate(rows) for x, px in enumerate(row) if px == BAR_BLUE]
    assert len(blue) > 500, "the accelerator cost bars are drawn"
    assert len({y for _, y in blue}) >= 30  # two bars of 20 px
