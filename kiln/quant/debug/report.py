"""The quantization debugger's results as a text table, CSV, and a self-contained HTML page
(inline CSS and an SVG bar chart of every op's error; no script, no network)."""

from __future__ import annotations

import csv
import html
import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .debugger import QuantizationDebugger, TensorReport

#: CSV columns: TensorFlow's debugger's names where they mean the same thing.
COLUMNS = ("op_index", "op_name", "tensor_name", "float_tensor_name", "dtype", "scale", "zero_point",
           "num_elements", "rmse", "max_abs_error", "mean_error", "relative_error", "rmse_over_scale",
           "layer_rmse", "layer_max_abs_error", "layer_relative_error", "denylist_name", "note")


def row_values(r: "TensorReport") -> dict:
    """One row's values by column name (None where a metric does not apply)."""
    c, layer = r.cumulative, r.layer
    return {
        "op_index": r.op_index, "op_name": r.op, "tensor_name": r.tensor, "float_tensor_name": r.float_tensor,
        "dtype": r.dtype, "scale": r.scale, "zero_point": r.zero_point, "num_elements": r.elements,
        "rmse": c.rmse, "max_abs_error": c.max_abs_error, "mean_error": c.mean_error,
        "relative_error": c.relative_error, "rmse_over_scale": r.rmse_over_scale,
        "layer_rmse": None if layer is None else layer.rmse,
        "layer_max_abs_error": None if layer is None else layer.max_abs_error,
        "layer_relative_error": None if layer is None else layer.relative_error,
        "denylist_name": r.denylist_name, "note": r.note,
    }


def _custom(r: "TensorReport") -> dict:
    """The user metrics: cumulative under their name, layer-wise as ``layer_<name>``."""
    values = dict(r.cumulative.metrics)
    values.update({f"layer_{k}": v for k, v in (r.layer.metrics if r.layer is not None else {}).items()})
    return values


def csv_text(debugger: "QuantizationDebugger") -> str:
    out = io.StringIO()
    extra = [name for k in debugger.metrics for name in (k, f"layer_{k}")]
    writer = csv.DictWriter(out, COLUMNS + tuple(extra), lineterminator="\n")
    writer.writeheader()
    for r in debugger.tensors:
        values = {**row_values(r), **_custom(r)}
        writer.writerow({k: "" if v is None else (repr(v) if isinstance(v, float) else v) for k, v in values.items()})
    return out.getvalue()


def _g(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def text_table(debugger: "QuantizationDebugger", *, name_width: int = 40) -> str:
    head = ("#", "op", "tensor", "scale", "zp", "rmse", "max|err|", "rel", "rmse/scale", "layer rmse",
            "layer rel")
    lines = []
    for r in debugger.tensors:
        v = row_values(r)
        lines.append((str(r.op_index), r.op, _short(r.tensor, name_width), _g(r.scale),
                      "-" if r.zero_point is None else str(r.zero_point), _g(v["rmse"]), _g(v["max_abs_error"]),
                      _g(v["relative_error"]), _g(v["rmse_over_scale"]), _g(v["layer_rmse"]),
                      _g(v["layer_relative_error"])))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join("{:<%d}" % w if i < 3 else "{:>%d}" % w for i, w in enumerate(widths))
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*line) for line in lines]
    out.append("")
    for o in debugger.outputs:
        top1 = "" if o.top1_agreement is None else f", top-1 agreement {o.top1_agreement:.1%}"
        out.append(f"output {o.name!r}: max |err| {o.errors.max_abs_error:.3g}, rmse {o.errors.rmse:.3g}, "
                   f"relative {o.errors.relative_error:.3g}{top1}")
    worst = debugger.worst_ops(1)
    if worst:
        out.append(f"adds the most error: {worst[0].op} {worst[0].tensor!r} "
                   f"(relative error {worst[0].added_error:.3g})")
    for op, name, why in debugger.unmatched:
        out.append(f"not measured: {op} {name!r}: {why}")
    return "\n".join(out)


# -- HTML ----------------------------------------------------------------------------------------
LAYER_COLOR, CUMULATIVE_COLOR, WORST_COLOR = "#2f7ed8", "#f0a30a", "#d62728"

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 8px; border-bottom: 1px solid #ddd; }
td.num { white-space: nowrap; } td.name { min-width: 16em; max-width: 30em; overflow-wrap: anywhere; }
th { text-align: left; background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.worst td { background: #fde8e8; } .legend span { display: inline-block; width: 12px; height: 12px;
margin: 0 4px 0 14px; vertical-align: middle; } .note { color: #777; }
"""


def _chart(rows: list, worst_index: int | None) -> str:
    """Horizontal bars per op: layer-wise (added) and cumulative relative error."""
    bar_h, gap, label_w, plot_w = 14, 8, 330, 520
    values = [v for r in rows for v in ((r.layer.relative_error if r.layer else 0.0), r.cumulative.relative_error)]
    top = max([v for v in values if v == v and v != float("inf")] + [1e-12])
    height = len(rows) * (2 * bar_h + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 90}" height="{height}" '
             'role="img" aria-label="relative error per op">']
    for k, r in enumerate(rows):
        y = 20 + k * (2 * bar_h + gap)
        prefix = f"#{r.op_index} {r.op} "
        label = html.escape(prefix + _short(r.tensor, max(8, 52 - len(prefix))))
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h + 4}" text-anchor="end" font-size="11">{label}</text>')
        for j, (kind, errors) in enumerate((("layer", r.layer), ("cumulative", r.cumulative))):
            value = errors.relative_error if errors is not None else 0.0
            width = 0.0 if value != value else plot_w * min(value, top) / top
            color = (WORST_COLOR if k == worst_index else LAYER_COLOR) if kind == "layer" else CUMULATIVE_COLOR
            parts.append(f'<rect class="bar {kind}" x="{label_w}" y="{y + j * bar_h}" width="{width:.1f}" '
                         f'height="{bar_h - 2}" fill="{color}"><title>{kind} relative error '
                         f'{_g(value)}</title></rect>')
            parts.append(f'<text x="{label_w + width + 4:.1f}" y="{y + j * bar_h + bar_h - 3}" '
                         f'font-size="10">{_g(value)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(head: list[str], rows: list[list], classes: list[str] | None = None, names: tuple[int, ...] = ()) -> str:
    """Numbers right-aligned and unbroken; the ``names`` columns (tensor names) wrap anywhere."""
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for k, row in enumerate(rows):
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        cells = "".join(f'<td class="num">{_g(v)}</td>' if isinstance(v, float) or v is None
                        else f'<td class="name">{html.escape(str(v))}</td>' if i in names
                        else f"<td>{html.escape(str(v))}</td>" for i, v in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    return "".join(out) + "</table>"


def html_page(debugger: "QuantizationDebugger", *, title: str = "Quantization debugger report") -> str:
    rows = debugger.tensors
    worst = debugger.worst_ops(1)
    worst_index = next((k for k, r in enumerate(rows) if worst and r is worst[0]), None)
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>{len(debugger.samples)} samples; float model {len(debugger.float_bytes):,} bytes, quantized model "
            f"{len(debugger.quantized_bytes):,} bytes ({len(debugger.quantized_bytes) / len(debugger.float_bytes):.2f}"
            "×).</p>"]
    if worst:
        w = worst[0]
        body.append(f'<p id="worst">Adds the most error: <b>{html.escape(w.op)}</b> '
                    f"<code>{html.escape(w.tensor)}</code> (relative error {_g(w.added_error)}).</p>")
    body.append("<h2>Model outputs</h2>")
    names = list(debugger.metrics)
    body.append(_table(["output", "max |error|", "rmse", "relative error", "top-1 agreement"] + names,
                       [[o.name, o.errors.max_abs_error, o.errors.rmse, o.errors.relative_error,
                         "-" if o.top1_agreement is None else f"{o.top1_agreement:.1%}"]
                        + [o.errors.metrics[n] for n in names] for o in debugger.outputs], names=(0,)))
    body.append("<h2>Relative error per op</h2>")
    body.append(f'<p class="legend"><span style="background:{LAYER_COLOR}"></span>layer-wise (added by the op)'
                f'<span style="background:{CUMULATIVE_COLOR}"></span>cumulative (whole model up to here)'
                f'<span style="background:{WORST_COLOR}"></span>worst op</p>')
    body.append(_chart(rows, worst_index))
    body.append("<h2>Tensors</h2>")
    head = ["#", "op", "tensor", "dtype", "scale", "zero point", "rmse", "max |error|", "relative",
            "rmse / scale", "layer rmse", "layer relative"] + names + ["note"]
    body.append(_table(head, [[r.op_index, r.op, r.tensor, r.dtype, r.scale,
                               "-" if r.zero_point is None else r.zero_point, r.cumulative.rmse,
                               r.cumulative.max_abs_error, r.cumulative.relative_error, r.rmse_over_scale,
                               None if r.layer is None else r.layer.rmse,
                               None if r.layer is None else r.layer.relative_error]
                              + [r.cumulative.metrics[n] for n in names] + [r.note] for r in rows],
                       ["worst" if k == worst_index else "" for k in range(len(rows))], names=(2,)))
    if debugger.unmatched:
        body.append("<h2>Not measured</h2><ul>" + "".join(
            f"<li>{html.escape(op)} <code>{html.escape(name)}</code>: {html.escape(why)}</li>"
            for op, name, why in debugger.unmatched) + "</ul>")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
