"""The conversion report: the original's text layout, a dict/JSON form, and a self-contained HTML page."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field

ACCELERATOR = "XLA"  # the original says "TPU"; kiln places functions on any XLA device
OPTIMIZATION_STAGES = ("sharding", "quantize", "bfloat16", "batch in the graph", "I/O shapes")


@dataclass
class FunctionEntry:
    name: str
    selected_by: str
    cost: int  # flops at the representative shapes
    bytes_accessed: int
    shapes: list
    call_sites: int
    alias: str | None = None
    served: bool = True  # called from the CPU part of a signature; other traces are compiled but not counted
    compiled_into: list = field(default_factory=list)  # accelerator functions that call it directly


@dataclass
class StageEntry:
    name: str
    status: str  # "applied", "skipped", "not implemented (issue #13)"
    changes: list = field(default_factory=list)
    seconds: float = 0.0  # wall time of the stage at conversion


@dataclass
class ConversionReport:
    input_model_dir: str
    output_model_dir: str
    functions: list = field(default_factory=list)  # FunctionEntry
    cpu_cost: int = 0
    cpu_functions: dict = field(default_factory=dict)  # name -> flops
    cpu_ops: dict = field(default_factory=dict)  # name -> {"ops": "AddV2 x1, ...", "why": ...}
    signatures: dict = field(default_factory=dict)  # key -> {"function":..., "placement":..., "batched":...}
    batching: list = field(default_factory=list)  # dicts of BatchedSite
    stages: list = field(default_factory=list)  # StageEntry
    warmup_records: int = 0
    warmup: dict = field(default_factory=dict)  # {"records": {signature: [rows...]}, "real_inputs", "skipped"}
    accuracy: dict = field(default_factory=dict)  # stage -> signature -> {"outputs": {name: errors}, ...}
    quantization: dict = field(default_factory=dict)  # method, samples, sizes
    io_shapes: list = field(default_factory=list)  # one dict per bucketed function
    unmeasured: list = field(default_factory=list)  # {"stage", "signature", "why"}: applied, error not measured
    accuracy_skipped: bool = False  # skip_accuracy_check: nothing was measured, by request
    timings: dict = field(default_factory=dict)  # conversion step -> seconds (stages and the final steps)
    latency: dict = field(default_factory=dict)  # function -> {"rows", "before_ms", "after_ms", ...} (latency.py)
    machine: str = ""  # where the latency was measured
    cost_source: str = ("accelerator: flops counted on the HLO TensorFlow's tf2xla bridge emits "
                        "(experimental_get_compiler_ir stage='hlo'); CPU: TensorFlow's registered per-op flops")

    @property
    def served_functions(self) -> list:
        return [f for f in self.functions if f.served]

    @property
    def accelerator_cost(self) -> int:
        return sum(f.cost for f in self.served_functions)

    @property
    def total_cost(self) -> int:
        return self.accelerator_cost + self.cpu_cost

    def _pct(self, part: int) -> float:
        return 100.0 * part / self.total_cost if self.total_cost else 0.0

    @property
    def text(self) -> str:
        total = self.total_cost
        costs = [self.cpu_cost] + [f.cost for f in self.served_functions]
        width = max(8, max(len(str(c)) for c in costs) + 2)  # the original's 8, wider for 7+ digit costs
        rule = "-" * (24 + width)
        lines = ["-------- Conversion Report --------",
                 f"{ACCELERATOR} cost of the model: {self._pct(self.accelerator_cost):5.2f}% "
                 f"({self.accelerator_cost}/{total})",
                 f"CPU cost of the model: {self._pct(self.cpu_cost):5.2f}% ({self.cpu_cost}/{total})",
                 "", "Cost breakdown", "=" * len(rule), f"{'%':<10}{'Cost':<{width}}Name", rule,
                 f"{self._pct(self.cpu_cost):<10.2f}{self.cpu_cost:<{width}}[CPU cost]"]
        for f in self.served_functions:
            lines.append(f"{self._pct(f.cost):<10.2f}{f.cost:<{width}}{f.name}")
        lines.append(rule)
        optimizations = [s for s in self.stages if s.name in OPTIMIZATION_STAGES]
        if optimizations:
            lines += ["", "Optimizations", "=" * 32]
            for stage in optimizations:
                lines += [f"{stage.name}: {stage.changes[0] if stage.changes else stage.status}"]
                lines += [f"  {c}" for c in stage.changes[1:]]
        lines += self._latency_lines() + self._warmup_lines() + self._accuracy_lines()
        return "\n".join(lines)

    def _latency_lines(self) -> list[str]:
        if not self.latency:
            return []
        lines = ["", f"Latency on this machine ({self.machine}), median per call, before -> after:"]
        for name, t in self.latency.items():
            if "error" in t:
                lines.append(f"  {name}: not timed ({t['error']})")
                continue
            ratio = t["after_ms"] / t["before_ms"] if t["before_ms"] else float("inf")
            how = f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"
            if t.get("first_call_only"):
                lines.append(f"  {name} at {t['rows']} rows: first calls only (too slow to repeat): "
                             f"{t['before_ms']:.0f} ms -> {t['after_ms']:.0f} ms with compilation ({how})")
                continue
            lines.append(f"  {name} at {t['rows']} rows: {t['before_ms']:.3f} ms -> {t['after_ms']:.3f} ms ({how}; "
                         f"first call {t['first_call_after_ms']:.0f} ms with XLA compilation)")
        return lines

    def _warmup_lines(self) -> list[str]:
        if not self.warmup:
            return []
        records = self.warmup.get("records", {})
        real = set(self.warmup.get("real_inputs", []))
        lines = ["", f"Warm-up: {self.warmup_records} record(s) for TF Serving"
                     + (": " + "; ".join(f"{k} {_shapes(shapes)} ({'real inputs' if k in real else 'zeros, empty strings'})"
                                         for k, shapes in records.items()) if records else "")]
        lines += [f"  no records for {s['signature']!r}: {s['why']}" for s in self.warmup.get("skipped", [])]
        return lines

    def _accuracy_lines(self) -> list[str]:
        if self.accuracy_skipped:
            return ["", "Accuracy check: skipped (skip_accuracy_check): the stages that can change results "
                        "were applied without measuring their error"]
        if self.unmeasured:
            return ["", "WARNING: applied without a measured error (inputs the model does not run; give real "
                        "inputs with --evaluation_data):"] + \
                [f"  {u['stage']} on signature {u['signature']!r}: {u['why']}" for u in self.unmeasured]
        return []

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict:
        return {
            "input_model_dir": self.input_model_dir,
            "output_model_dir": self.output_model_dir,
            "accelerator": ACCELERATOR,
            "accelerator_cost": self.accelerator_cost,
            "cpu_cost": self.cpu_cost,
            "total_cost": self.total_cost,
            "cost_unit": "flops",
            "cost_source": self.cost_source,
            "functions": [asdict(f) for f in self.functions],
            "cpu_functions": dict(self.cpu_functions),
            "cpu_ops": dict(self.cpu_ops),
            "signatures": dict(self.signatures),
            "batching": list(self.batching),
            "stages": [asdict(s) for s in self.stages],
            "warmup_records": self.warmup_records,
            "warmup": dict(self.warmup),
            "accuracy": self.accuracy,
            "quantization": dict(self.quantization),
            "io_shapes": list(self.io_shapes),
            "unmeasured": list(self.unmeasured),
            "accuracy_skipped": self.accuracy_skipped,
            "timings": dict(self.timings),
            "latency": dict(self.latency),
            "machine": self.machine,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_html(self) -> str:
        return render_html(self)


def _shapes(shapes: list) -> str:
    """"at 1, 2, 4 rows" when only the batch varies, else the shapes of the first input."""
    if all(len(x) == len(shapes[0]) and x[1:] == shapes[0][1:] for x in shapes) and shapes and shapes[0]:
        return "at " + ", ".join(str(x[0]) for x in shapes) + " rows"
    return "of shapes " + ", ".join("x".join(map(str, x)) for x in shapes)


def _bars(report: ConversionReport) -> str:
    rows = [("[CPU cost]", report.cpu_cost, "#9aa5b1")] + [(f.name, f.cost, "#2f7ed8") for f in report.served_functions]
    peak = max([c for _, c, _ in rows] + [1])
    height = 26 * len(rows) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="820" height="{height}" role="img" '
             f'aria-label="cost per function">']
    for i, (name, cost, color) in enumerate(rows):
        y = 5 + 26 * i
        width = int(380 * cost / peak)
        parts.append(f'<text x="0" y="{y + 16}" font-size="12">{html.escape(name[:40])}</text>'
                     f'<rect class="bar" x="260" y="{y}" width="{width}" height="20" fill="{color}"/>'
                     f'<text x="{266 + width}" y="{y + 16}" font-size="12">{cost} ({report._pct(cost):.2f}%)</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(headers, rows) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: ConversionReport) -> str:
    """One file, no external assets: inline CSS and an SVG bar chart."""
    sigs = [(k, v.get("function"), v.get("placement"), v.get("batched")) for k, v in sorted(report.signatures.items())]
    batching = [(b["function"], b["caller"], b["shared_name"], b["attrs"].get("max_batch_size"),
                 b["attrs"].get("allowed_batch_sizes"), b["attrs"].get("batch_timeout_micros"),
                 b["attrs"].get("num_batch_threads"), b["attrs"].get("max_enqueued_batches"),
                 b["attrs"].get("enable_large_batch_splitting"), "updated" if b.get("updated") else "added")
                for b in report.batching]
    cpu = [(name, report.cpu_ops.get(name, {}).get("ops", ""), flops,
            report.cpu_ops.get(name, {}).get("why", "not selected as an accelerator function"))
           for name, flops in sorted(report.cpu_functions.items())]
    stages = [(s.name, s.status, "; ".join(s.changes)) for s in report.stages]
    accuracy = [(stage, key, m.get("source", ""), m.get("samples", ""), out, f"{e.get('max_abs', 0):.3g}",
                 f"{e.get('max_rel', 0):.3g}")
                for stage, per_sig in sorted(report.accuracy.items()) for key, m in sorted(per_sig.items())
                for out, e in sorted(m.get("outputs", {}).items())]
    buckets = [(b["function"], b["batch_buckets"], b["dimension_buckets"], b["max_compiles"]) for b in report.io_shapes]
    latency = [(name, t.get("rows"), t.get("before_ms", ""), t.get("after_ms", ""), t.get("first_call_after_ms", ""),
                t.get("error", "")) for name, t in report.latency.items()]
    warm = [(k, "; ".join("x".join(map(str, shape)) for shape in shapes), "") for k, shapes in
            report.warmup.get("records", {}).items()] + [(x["signature"], "none", x["why"])
                                                         for x in report.warmup.get("skipped", [])]
    unmeasured = [(u["stage"], u["signature"], u["why"]) for u in report.unmeasured]
    timings = [(k, f"{v:.2f}") for k, v in report.timings.items()]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kiln conversion report</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #1f2933; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; }}
th, td {{ border: 1px solid #cbd2d9; padding: 4px 8px; font-size: 13px; text-align: left; }}
th {{ background: #f0f4f8; }}
pre {{ background: #f5f7fa; padding: 12px; }}
</style></head><body>
<h1>kiln conversion report</h1>
<p>{html.escape(report.input_model_dir)} &rarr; {html.escape(report.output_model_dir)}</p>
<pre id="report-text">{html.escape(report.text)}</pre>
<h2>Cost per function (flops)</h2>
{_bars(report)}
<p><small>{html.escape(report.cost_source)}</small></p>
<h2>Signatures</h2>
{_table(["signature", "function", "placement", "batched"], sigs)}
<h2>Accelerator functions</h2>
{_table(["function", "alias", "selected by", "flops", "bytes accessed", "shapes", "call sites", "served"],
        [(f.name, f.alias or "", f.selected_by, f.cost, f.bytes_accessed, f.shapes, f.call_sites, f.served)
         for f in report.functions])}
<h2>Batching</h2>
{_table(["function", "caller", "shared_name", "max_batch_size", "allowed_batch_sizes", "batch_timeout_micros",
         "num_batch_threads", "max_enqueued_batches", "large batch splitting", "op"], batching)}
<h2>Ops that stayed on the CPU</h2>
{_table(["function", "ops", "flops", "why"], cpu)}
<h2>Accuracy of each optimization</h2>
{_table(["stage", "signature", "inputs", "samples", "output", "max abs error", "max relative error"], accuracy)}
<h2>I/O shape buckets</h2>
{_table(["function", "batch buckets", "other dimensions", "max XLA compilations"], buckets)}
<h2>Latency on this machine</h2>
<p>{html.escape(report.machine)}; median per call, before (input model) and after (converted)</p>
{_table(["function", "rows", "before ms", "after ms", "first call after ms (XLA compilation)", "not timed"], latency)}
<h2>Warm-up records</h2>
{_table(["signature", "record shapes (first input)", "why none"], warm)}
{"<h2>Not measured</h2>" + _table(["stage", "signature", "why"], unmeasured) if unmeasured else ""}
<p>{"Accuracy check skipped (skip_accuracy_check)." if report.accuracy_skipped else ""}</p>
<h2>Stages</h2>
{_table(["stage", "status", "changes"], stages)}
<h2>Conversion time (seconds)</h2>
{_table(["step", "seconds"], timings)}
<p>{report.warmup_records} warm-up records written.</p>
</body></html>
"""
