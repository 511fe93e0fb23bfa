"""``kiln.inference.convert``: SavedModel -> accelerator-ready SavedModel, as a list of named stages.

Each stage edits the parsed SavedModel in memory and records what it changed in the report;
part 2 (issue #13: bfloat16, quantization, I/O shapes, sharding) adds stages to ``STAGES``. The
output is written to a temporary directory next to ``output_model_dir`` and renamed into place
only when everything succeeded, so an error never leaves a half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import asdict
from pathlib import Path

from ..errors import KilnError, UnsupportedError
from . import options as opts
from . import rewrite, savedmodel, trial, warmup
from .report import ConversionReport, FunctionEntry, StageEntry


class OutputError(KilnError, OSError):
    """The output directory cannot be written."""


class _State:
    """What the stages share: the model being edited, the options, and the report being filled."""

    def __init__(self, model, options, report):
        self.model = model
        self.options = options
        self.report = report
        self.accelerator: dict[str, str] = {}
        self.call_sites: dict[str, int] = {}
        self.batched: list = []
        self.token = uuid.uuid4().hex[:8]  # shared_name prefix: unique per conversion


def _stage_select(s: _State) -> list[str]:
    s.accelerator = savedmodel.select_accelerator_functions(s.model, s.options.tpu_functions)
    return [f"{name} ({how})" for name, how in s.accelerator.items()]


def _stage_place(s: _State) -> list[str]:
    s.call_sites = rewrite.place_on_xla(s.model, s.accelerator)
    return [f"{name}: _XlaMustCompile on {n} call site(s)" for name, n in s.call_sites.items()]


def _batch_targets(s: _State, entry, index: int) -> list[str]:
    kind = entry.experimental.WhichOneof("batch_function") if entry.HasField("experimental") else None
    if kind:
        return savedmodel.resolve_target(s.model, kind, getattr(entry.experimental, kind),
                                         f"batch_options[{index}].experimental")
    return list(s.accelerator)


def _stage_batch(s: _State) -> list[str]:
    changes, batched_by = [], {}
    existing = list(rewrite.existing_batch_ops(s.model))
    for i, entry in enumerate(s.options.batch_options):
        opts.check_batch_options(entry, i)
        has_target = entry.HasField("experimental") and entry.experimental.WhichOneof("batch_function")
        if existing and not has_target:
            sites = rewrite.update_existing(s.model, entry, s.token, i)
            changes += [f"updated existing BatchFunction {b.node} in {b.caller}" for b in sites]
            s.batched += sites
            continue
        targets = _batch_targets(s, entry, i)
        if not targets:
            raise savedmodel.SelectionError(
                f"batch_options[{i}] has no function to batch: no accelerator functions are selected and "
                f"experimental.function_alias / concrete_function_name / signature_name is not set")
        added = []
        for name in targets:
            if name in batched_by:
                raise savedmodel.SelectionError(f"function {name!r} is batched twice: by {batched_by[name]} and "
                                                f"by batch_options[{i}]")
            batched_by[name] = f"batch_options[{i}]"
            added += rewrite.batch_function(s.model, name, entry, s.token, set(s.accelerator), f"batch_options[{i}]")
        if not added:
            raise rewrite.BatchingError(f"batch_options[{i}]: no function of {targets} is called from another "
                                        f"function, so there is no call site to batch")
        changes += [f"{b.function} in {b.caller}: BatchFunction shared_name {b.shared_name}" for b in added]
        s.batched += added
    return changes


def _stage_part2(s: _State) -> list[str]:
    """bfloat16 / quantization / I/O shapes / sharding are issue #13: refuse what would change results."""
    o = s.options
    State = opts.messages()["State"]
    asked = []
    if o.bfloat16_optimization.state == State.values_by_name["ENABLED"].number:
        asked.append("bfloat16_optimization")
    if o.io_shape_optimization.state == State.values_by_name["ENABLED"].number:
        asked.append("io_shape_optimization")
    if o.HasField("external_feature_configs") and o.external_feature_configs.HasField("quantization_options"):
        asked.append("external_feature_configs.quantization_options")
    if o.HasField("xla_sharding_options"):
        asked.append("xla_sharding_options")
    if asked:
        raise UnsupportedError(f"{', '.join(asked)}: not implemented yet in kiln infer-convert (issue #13); "
                               f"remove it (bfloat16_optimization {{ state: DISABLED }} keeps float32)")
    return ["dtypes unchanged (bfloat16 and quantization stages come with issue #13)"]


STAGES = [
    ("select accelerator functions", _stage_select),
    ("place on XLA", _stage_place),
    ("batch in the graph", _stage_batch),
    ("bfloat16 / quantization / I/O shapes / sharding", _stage_part2),
]


def _batch_of(s: _State):
    sizes = {b.function: min(b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]]) for b in s.batched}
    return lambda name: sizes.get(name, 1)


def _costs(s: _State, model_dir: Path) -> None:
    batch_of = _batch_of(s)
    runner = trial.Trial(savedmodel.SavedModelFile(model_dir, s.model.proto, s.model.meta, s.model.functions))
    aliases = s.model.aliases
    served = set()
    for key in s.model.signatures:
        wrapper = savedmodel.signature_wrapper(s.model, key)
        served |= savedmodel.reachable(s.model, wrapper) | {wrapper}
    for name, how in s.accelerator.items():
        cost = runner.compile(name, batch_of(name))
        s.report.functions.append(FunctionEntry(name, how, cost.flops, cost.bytes_accessed, cost.shapes,
                                                s.call_sites.get(name, 0), aliases.get(name), name in served))
    cpu = trial.cpu_functions(s.model, set(s.accelerator))
    s.report.cpu_functions = {k: v for k, v in trial.cpu_flops(s.model, cpu, batch_of, runner.renamed).items()}
    s.report.cpu_cost = sum(s.report.cpu_functions.values())
    s.report.cpu_ops = {name: _cpu_ops(s, name) for name in cpu}


_PLUMBING = {"NoOp", "Identity", "Const", "StatefulPartitionedCall", "PartitionedCall", "ReadVariableOp"}


def _cpu_ops(s: _State, name: str) -> dict:
    """The compute ops a CPU function runs itself, and why it is on the CPU."""
    from collections import Counter

    counts = Counter(n.op for n in s.model.functions[name].node_def if n.op not in _PLUMBING)
    if name.startswith("__kiln_batched_"):
        why = "kiln's batching wrapper: BatchFunction and its queue run on the CPU"
    elif counts.get(rewrite.BATCH_OP):
        why = "calls BatchFunction, which runs on the CPU"
    else:
        why = "not selected as an accelerator function"
    return {"ops": ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())), "why": why}


def _signatures(s: _State) -> dict:
    out = {}
    for key in sorted(s.model.signatures):
        wrapper = savedmodel.signature_wrapper(s.model, key)
        below = savedmodel.reachable(s.model, wrapper) | {wrapper}
        on_xla = sorted(a for a in s.accelerator if a in below)
        batched = sorted({b.shared_name for b in s.batched if b.caller in below or b.function in below})
        sizes = sorted({n for b in s.batched if b.caller in below
                        for n in (b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]])})
        out[key] = {"function": savedmodel.signature_function(s.model, key),
                    "placement": f"{rewrite_label(on_xla)}", "batched": batched, "warmup_batch_sizes": sizes or [1]}
    return out


def rewrite_label(on_xla) -> str:
    return ("XLA: " + ", ".join(on_xla)) if on_xla else "CPU"


def _write_fingerprint(model_dir: Path) -> None:
    """A fingerprint of the new saved_model.pb (the copied one would describe the input)."""
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    stale = model_dir / "fingerprint.pb"
    stale.unlink(missing_ok=True)
    stale.write_bytes(fingerprinting.CreateFingerprintDef(str(model_dir)))


def _prepare_output(output_model_dir) -> tuple[Path, Path]:
    out = Path(output_model_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"output_model_dir {str(out)!r} already exists and is not an empty directory")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"the parent directory of output_model_dir {str(out)!r} does not exist")
    tmp = parent / f".{out.name}.kiln-tmp-{uuid.uuid4().hex[:8]}"
    return out, tmp


def convert(input_model_dir, output_model_dir, options=None) -> ConversionReport:
    """Convert; ``options`` is a ConverterOptions text proto or message. Returns the report."""
    options = opts.coerce(options)
    model = savedmodel.read(input_model_dir)
    out, tmp = _prepare_output(output_model_dir)
    report = ConversionReport(str(input_model_dir), str(output_model_dir))
    state = _State(model, options, report)
    for name, stage in STAGES:
        report.stages.append(StageEntry(name, "applied", stage(state)))
    try:
        shutil.copytree(model.path, tmp, ignore=shutil.ignore_patterns("saved_model.pb"))
        (tmp / "saved_model.pb").write_bytes(model.proto.SerializeToString())
        _write_fingerprint(tmp)
        _costs(state, tmp)  # trial compilation: raises before anything is published
        report.signatures = _signatures(state)
        report.batching = [asdict(b) for b in state.batched]
        extra = tmp / "assets.extra"
        (extra / "kiln").mkdir(parents=True, exist_ok=True)
        requests = [(key, warmup.representative_inputs(model.meta.signature_def[key], n))
                    for key, info in report.signatures.items() for n in info["warmup_batch_sizes"]]
        report.warmup_records = warmup.write_records(extra / warmup.WARMUP_FILE, requests)
        (extra / "kiln" / "converter_options.pbtxt").write_text(opts.to_text(options))
        (extra / "kiln" / "report.txt").write_text(report.text + "\n")
        (extra / "kiln" / "report.json").write_text(report.to_json() + "\n")
        (extra / "kiln" / "report.html").write_text(report.to_html())
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report
