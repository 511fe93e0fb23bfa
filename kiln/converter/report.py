"""`ConversionReport`: what a conversion produced and why (available as ``converter.report``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..ir import Model
from ..rules import STAGES, Decision


@dataclass
class ConversionReport:
    """Operator counts, size and time of one conversion, and what was fused or not.

    Attributes:
      op_counts: operator name -> count over all subgraphs (custom ops by custom code).
      op_versions: sorted (operator name, version) pairs the model uses.
      size: bytes of the written model.
      seconds: wall time of the conversion pipeline (all its stages).
      stages: (stage name, seconds) of each pipeline stage that ran, in order ("import",
        "optimise", "version", "metadata", "write"; see kiln/converter/pipeline.py).
      decisions: every rule's verdict (`kiln.rules.Decision`: stage, subject, rule, fired,
        detail), from Keras layer routing, composite and loop fusion, TF-level patterns and
        the rule-based passes; ``fused`` / ``not_fused`` / ``notes`` are views of it.
      custom_ops: TF op types emitted as CUSTOM (``allow_custom_ops``).
      tf_ops: TF op types seen in the imported graphs, with counts.
      lowered: TF op type (or TF-level pattern name) -> the builtin ops its legalisation
        emitted, before the optimisation passes (`kiln.converter.legalize.coverage` says what
        each may emit; the op sweep checks that it does not emit more).
      subgraphs: number of subgraphs.
      min_runtime_version: the model's ``min_runtime_version``.
      missing_records: builtin ops without a kiln op record (their version could not be set).
      passes: per pass, how many rounds changed the model.
      quantization: when quantized: {"mode", "quantized" (count), "kept_float" (op: reason)}.
    """

    op_counts: dict[str, int] = field(default_factory=dict)
    op_versions: list[tuple[str, int]] = field(default_factory=list)
    size: int = 0
    seconds: float = 0.0
    stages: list[tuple[str, float]] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    custom_ops: dict[str, int] = field(default_factory=dict)
    tf_ops: dict[str, int] = field(default_factory=dict)
    lowered: dict[str, list[str]] = field(default_factory=dict)
    subgraphs: int = 0
    min_runtime_version: str = ""
    missing_records: list[str] = field(default_factory=list)
    passes: dict[str, int] = field(default_factory=dict)
    quantization: dict = field(default_factory=dict)

    @property
    def fused(self) -> list[str]:
        """Composite functions and loops fused, as report lines ("lstm: fused into ...")."""
        return [str(d) for d in self.decisions if d.fired and d.stage == "fusion"]

    @property
    def not_fused(self) -> list[str]:
        """Layers and composite functions left unfused, each with the reason."""
        return [str(d) for d in self.decisions if not d.fired and d.stage in ("keras", "fusion")]

    @property
    def notes(self) -> list[str]:
        """What tracing decided (Keras recurrent layers routed to fusions)."""
        return [str(d) for d in self.decisions if d.fired and d.stage == "keras"]

    def decided(self, *, stage: str | None = None, fired: bool | None = None) -> list[Decision]:
        """The decisions of one stage and/or outcome."""
        return [d for d in self.decisions
                if (stage is None or d.stage == stage) and (fired is None or d.fired == fired)]

    @property
    def num_ops(self) -> int:
        return sum(self.op_counts.values())

    def stage_seconds(self, *names: str) -> float:
        """Time spent in the named stages (0 for stages that did not run)."""
        return sum(seconds for name, seconds in self.stages if name in names)

    @property
    def import_seconds(self) -> float:
        return self.stage_seconds("import")

    @property
    def pass_seconds(self) -> float:
        """Optimisation passes and versioning (what the pass managers ran)."""
        return self.stage_seconds("optimise", "version")

    @property
    def write_seconds(self) -> float:
        return self.stage_seconds("write")

    def record_model(self, model: Model) -> None:
        counts: Counter = Counter()
        versions = set()
        for _, _, op in model.operators():
            counts[op.name] += 1
            versions.add((op.name, op.version))
        self.op_counts = dict(sorted(counts.items()))
        self.op_versions = sorted(versions)
        self.subgraphs = len(model.subgraphs)

    def to_dict(self) -> dict:
        """The whole report as JSON-ready data (``json.dumps(report.to_dict())``), decisions
        included (see `kiln.rules.Decision.to_dict`)."""
        return {
            "op_counts": dict(self.op_counts), "op_versions": [list(p) for p in self.op_versions],
            "size": self.size, "seconds": self.seconds, "stages": [list(s) for s in self.stages],
            "decisions": [d.to_dict() for d in self.decisions], "custom_ops": dict(self.custom_ops),
            "tf_ops": dict(self.tf_ops), "lowered": {k: list(v) for k, v in self.lowered.items()},
            "subgraphs": self.subgraphs,
            "min_runtime_version": self.min_runtime_version, "missing_records": list(self.missing_records),
            "passes": dict(self.passes), "quantization": dict(self.quantization),
        }

    def explain(self, *, declined_only: bool = False) -> str:
        """Every decision as a table: stage, subject, rule, fired, and the reason it declined
        (or what it did), grouped by stage in pipeline order."""
        rows = [d for d in self.decisions if not (declined_only and d.fired)]
        if not rows:
            return "no rewrite decisions" + (" declined" if declined_only else "")
        order = {stage: i for i, stage in enumerate(STAGES)}
        rows.sort(key=lambda d: order.get(d.stage, len(order)))   # stable: settling order within a stage
        table = [("stage", "subject", "rule", "fired", "reason / result")]
        for d in rows:
            result = d.detail
            if d.fired and result.startswith(f"{d.subject}: "):
                result = result[len(d.subject) + 2:]   # the subject is its own column
            table.append((d.stage, d.subject, d.rule, "yes" if d.fired else "no", result))
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths)) + "  " + r[4] for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len(table[0][4]))
        return "\n".join(line.rstrip() for line in lines)

    def summary(self) -> str:
        """A few lines for the command line."""
        ops = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in self.op_counts.items())
        lines = [
            f"{self.num_ops} ops in {self.subgraphs} subgraph(s): {ops or '-'}",
            f"size {self.size} bytes, converted in {self.seconds:.3f} s, min runtime {self.min_runtime_version or '-'}",
        ]
        if self.stages:
            lines.append("stages: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in self.stages))
        if self.fused:
            lines.append("fused: " + "; ".join(self.fused))
        if self.notes:
            lines.append("notes: " + "; ".join(self.notes))
        if self.not_fused:
            lines.append("not fused: " + "; ".join(self.not_fused))
        rewrites = self.decided(stage="pass") + self.decided(stage="legalize")
        if rewrites:
            declined = sum(not d.fired for d in rewrites)
            lines.append(f"rewrite rules: {len(rewrites) - declined} applied, {declined} declined "
                         f"(report.decisions has each with its reason)")
        if self.custom_ops:
            lines.append("custom ops: " + ", ".join(sorted(self.custom_ops)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
