"""The inference converter's pipeline: SavedModel -> accelerator-ready SavedModel, as named stages.

Each stage edits the parsed SavedModel in memory and records what it changed (and its wall time)
in the report; the stages that can change results (quantize, bfloat16, batching, I/O shapes) also
record the error they cost, measured by the accuracy guard (guard.py) in TensorFlow on snapshots
before and after. Then the output steps: costs, the placed functions' latency before and after,
warm-up records, the report files. (The module is not called ``convert`` so
importing it cannot rebind ``kiln.inference.convert``, the function.) The output is written to a
temporary directory next to ``output_model_dir`` and renamed into place only when everything
succeeded, so an error never leaves a half-written model behind.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
import warnings
from dataclasses import asdict
from pathlib import Path

from ..errors import KilnError
from . import options as opts
from . import (batchcheck, bfloat16, buckets, effects, evaluate, graft, guard, latency, quantize, rewrite,
               savedmodel, sharding, trial, warmup)
from .report import ConversionReport, FunctionEntry, StageEntry


class OutputError(KilnError, OSError):
    """The output directory cannot be written."""


class _State:
    """What the stages share: the model being edited, the options, and the report being filled."""

    def __init__(self, model, options, report, evaluation_data=None):
        self.model = model
        self.options = options
        self.report = report
        self.accelerator: dict[str, str] = {}
        self.call_sites: dict[str, int] = {}
        self.batched: list = []
        self.token = uuid.uuid4().hex[:8]  # shared_name prefix: unique per conversion
        self.scratch = None  # evaluate.Scratch: snapshots and the quantized model, removed at the end
        self.guard = guard.Guard(model, options, evaluation_data)
        self.bucketed: list = []


def _stage_select(s: _State) -> list[str]:
    s.accelerator = savedmodel.select_accelerator_functions(s.model, s.options.tpu_functions)
    return [f"{name} ({how})" for name, how in s.accelerator.items()]


def _stage_place(s: _State) -> list[str]:
    s.call_sites = rewrite.place_on_xla(s.model, s.accelerator)
    if s.accelerator:  # trial-compile now: a function XLA cannot take fails before anything is measured
        runner, live = trial.Trial(s.model), savedmodel.live_functions(s.model)
        for name in s.accelerator:
            if name in live:
                runner.compile(name, 1)
    return [f"{name}: _XlaMustCompile on {n} call site(s)" for name, n in s.call_sites.items()]


def _batch_targets(s: _State, entry, index: int) -> tuple[list[str], set | None]:
    """(functions to batch, the callers whose call sites to batch). A signature target batches the
    function only where that signature calls it, not under other signatures; dead code is left alone."""
    kind = entry.experimental.WhichOneof("batch_function") if entry.HasField("experimental") else None
    live = savedmodel.live_functions(s.model)
    if not kind:
        return list(s.accelerator), live
    value = getattr(entry.experimental, kind)
    names = savedmodel.resolve_target(s.model, kind, value, f"batch_options[{index}].experimental")
    if kind != "signature_name":
        return names, live
    wrapper = savedmodel.signature_wrapper(s.model, value)
    return names, savedmodel.reachable(s.model, wrapper) | {wrapper}


def _stage_batch(s: _State) -> list[str]:
    if not s.options.batch_options:
        return ["no batch_options: nothing batched"]
    before = s.scratch.snapshot(s.model, "before_batch")
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
        targets, callers = _batch_targets(s, entry, i)
        if not targets:
            raise savedmodel.SelectionError(
                f"batch_options[{i}] has no function to batch: no accelerator functions are selected and "
                f"experimental.function_alias / concrete_function_name / signature_name is not set")
        added = []
        for name in targets:
            for (function, caller), by in batched_by.items():
                if function == name and (callers is None or caller in callers):
                    raise savedmodel.SelectionError(f"function {name!r} is batched twice: by {by} and "
                                                    f"by batch_options[{i}]")
            sites = rewrite.batch_function(s.model, name, entry, s.token, set(s.accelerator), f"batch_options[{i}]",
                                           callers)
            batched_by.update({(b.function, b.caller): f"batch_options[{i}]" for b in sites})
            added += sites
        if not added:
            raise rewrite.BatchingError(f"batch_options[{i}]: no function of {targets} is called from another "
                                        f"function, so there is no call site to batch")
        runner = trial.Trial(s.model)
        for name in sorted({b.function for b in added}):
            changes += batchcheck.check_batch_major(runner, name, rewrite.check_batchable(s.model, name, ""),
                                                    f"batch_options[{i}]")
        changes += [f"{b.function} in {b.caller}: BatchFunction shared_name {b.shared_name}" for b in added]
        s.batched += added
    return changes + _measure_batching(s, before)


def _measure_batching(s: _State, before: str) -> list[str]:
    """Concurrent requests through the batched model against the model before (batchcheck.py)."""
    callers = {b.caller for b in s.batched}
    keys = savedmodel.signatures_reaching(s.model, callers)
    if not keys:
        return []
    stateful = {}
    for key in keys:
        below = savedmodel.reachable(s.model, savedmodel.signature_wrapper(s.model, key))
        found = [e for f in sorted({b.function for b in s.batched if b.caller in below | {b.caller}})
                 if f in s.model.functions for e in effects.effects(s.model, f)]
        if found:
            stateful[key] = [effects.describe(found)]
    if s.guard.skip:
        return [f"{key}: the batched function keeps state ({'; '.join(v)}); not measured (skip_accuracy_check)"
                for key, v in sorted(stateful.items())] + s.guard.lines(None, "batched vs unbatched")
    inputs = {k: v[0] for k, v in s.guard.inputs(s.model).items() if k in keys}
    size = batchcheck.rows_of(inputs) + 2  # at least two rows of another request in every batch
    probe = batchcheck.probe_snapshot(s.model, s.scratch.path / "after_batch", size)
    measured = s.guard.measure("batching", s.model, before, probe, keys, "remove the batch_options entry",
                               runner=lambda path, feeds: batchcheck.run_concurrently(path, feeds, size),
                               keep_reference=True)
    s.report.accuracy["batching"] = measured
    notes = batchcheck.refuse_changed(measured, stateful)
    return notes + s.guard.lines(measured, "concurrent requests batched vs one at a time")


def _stage_sharding(s: _State) -> list[str]:
    return sharding.plan(s.options)


def _stage_quantize(s: _State) -> list[str]:
    o = s.options
    if not (o.HasField("external_feature_configs") and o.external_feature_configs.HasField("quantization_options")):
        return ["skipped: no external_feature_configs.quantization_options"]
    q = o.external_feature_configs.quantization_options
    plan = quantize.plan(s.model, q)
    calibration = {}
    for key, samples in plan["samples"].items():
        calibration[key], s.guard.held_out[key] = quantize.split(samples)
    prepared, out = s.scratch.path / "quantizer_input", s.scratch.path / "quantized"
    removed = graft.prepare(s.model, plan["keys"], prepared)
    quantize.quantize(prepared, out, q, calibration)
    before = str(s.model.path)  # the input on disk; the model is edited in memory from here
    s.model.twins = graft.graft(s.model, out, plan["keys"], removed)
    after = s.scratch.snapshot(s.model, "after_quantize")
    measured = s.guard.measure("quantize", s.model, before, after, plan["keys"],
                               "remove external_feature_configs.quantization_options or try another method")
    if measured is not None:
        s.report.accuracy["quantization"] = measured
    size_before, size_after = quantize.sizes(before, after)
    s.report.quantization = {"method": plan["method"], "signature_keys": plan["keys"],
                             "calibration_samples": {k: len(v) for k, v in calibration.items()},
                             "held_out_samples": {k: len(v) for k, v in s.guard.held_out.items()},
                             "bytes_before": size_before, "bytes_after": size_after}
    lines = [f"{plan['method']} (op set XLA) on {', '.join(plan['keys'])}: model {size_before} -> {size_after} "
             f"bytes ({size_after / max(size_before, 1):.2f}x; the float32 variables stay for the object graph "
             f"and the signatures not quantized); calibration samples "
             f"{dict(s.report.quantization['calibration_samples']) or 'none (no dataset needed)'}"]
    unlisted = sorted(set(s.model.signatures) - set(plan["keys"]))
    if unlisted:
        lines.append(f"kept in float32 (not in signature_keys): {', '.join(unlisted)}")
    return lines + s.guard.lines(measured, "error vs float")


def _stage_bfloat16(s: _State) -> list[str]:
    why = opts.disabled_by(s.options, "bfloat16_optimization")
    if why:
        return [f"skipped: {why}"]
    if s.report.quantization and opts.state_name(s.options, "bfloat16_optimization") != "ENABLED":
        return ["skipped: the model is int8-quantized, and bfloat16 would re-round its quantize/dequantize "
                "arithmetic; bfloat16_optimization: ENABLED applies both"]
    # before: the model as placed; numerically that is the input model (XLA float32 equals TensorFlow's
    # kernels to rounding) unless quantized, so the input is run instead (no XLA compilation to wait for)
    before = s.scratch.snapshot(s.model, "before_bf16") if s.report.quantization else s.report.input_model_dir
    lines, changed = bfloat16.rewrite(s.model, s.accelerator, s.options, s.scratch.path / "bf16_model")
    if not changed:
        return lines
    measured = s.guard.measure("bfloat16", s.model, before, s.scratch.snapshot(s.model, "after_bf16"),
                               savedmodel.signatures_reaching(s.model, changed),
                               "add the failing op type to bfloat16_optimization_options.filterlist or set "
                               "bfloat16_optimization: DISABLED")
    if measured is not None:
        s.report.accuracy["bfloat16"] = measured
    return lines + s.guard.lines(measured, "error vs float32")


def _stage_io_shapes(s: _State) -> list[str]:
    why = opts.disabled_by(s.options, "io_shape_optimization")
    if why:
        return [f"skipped: {why}"]
    if not s.accelerator:
        return ["no accelerator functions: nothing to bucket"]
    sizes = {}
    for b in s.batched:
        sizes.setdefault(b.function, b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]])
    before = s.scratch.snapshot(s.model, "before_io")
    done, notes = buckets.apply(s.model, s.accelerator, sizes, s.options.experimental)
    s.bucketed = done
    for b in done:  # a router in front of a batch op: one queue per bucket replaces the op
        if b.replaced:
            s.batched = [x for x in s.batched if (x.caller, x.node) not in b.replaced] + b.batch_ops
    s.report.io_shapes = [dict(function=b.function, wrapper=b.wrapper, batch_buckets=b.batch_buckets,
                               dimension_buckets=b.dimension_buckets, call_sites=b.call_sites,
                               max_compiles=b.max_compiles) for b in done]
    lines = [f"{b.function}: batch buckets {b.batch_buckets or 'none'}"
             + (" (BatchFunction's allowed_batch_sizes)" if b.function in sizes else "")
             + "".join(f", {k} buckets {v}" for k, v in b.dimension_buckets.items())
             + f" -> at most {b.max_compiles} XLA compilation(s)"
             + (" (BatchFunction splits larger requests)" if b.function in sizes else
                " up to the largest bucket, then one per multiple of it")
             + f" ({b.call_sites} call site(s))"
             + ("; padded before the batch op, one BatchFunction queue per bucket, longer inputs run "
                "unbatched" if b.replaced else "") for b in done]
    padded = {b.wrapper for b in done if b.wrapper.startswith(buckets.PREFIX)} | {r for b in done for r in b.routers}
    if padded:
        measured = s.guard.measure("I/O shapes", s.model, before, s.scratch.snapshot(s.model, "after_io"),
                                   savedmodel.signatures_reaching(s.model, padded), "set io_shape_optimization: DISABLED")
        if measured is not None:
            s.report.accuracy["io_shapes"] = measured
            _refuse_row_mixing(s, measured, padded)
        lines += s.guard.lines(measured, "padded vs unpadded")
    return (lines or ["nothing bucketed"]) + notes


#: padded vs unpadded beyond this (relative to the output's magnitude) means the function mixes rows
#: (a batch statistic) or positions: padding would change served results. Same-precision runs at two
#: shapes differ by at most a few bfloat16 ulps.
PADDING_TOLERANCE = 1e-2


def _refuse_row_mixing(s: _State, measured: dict, padded: set) -> None:
    for key, m in sorted(measured.items()):
        for name, e in sorted(m.get("outputs", {}).items()):
            if e.get("max_rel", 0) > PADDING_TOLERANCE or e.get("exact") is False:
                below = savedmodel.reachable(s.model, savedmodel.signature_wrapper(s.model, key))
                found = [x for f in sorted(padded & below) for x in effects.effects(s.model, f)]
                why = f"keeps state that padding rows reach ({effects.describe(found)})" if found else \
                    "mixes rows (e.g. a batch statistic) or padded positions"
                raise evaluate.StageError(
                    f"I/O shapes: padding to buckets changes output {name!r} of signature {key!r} (max relative error "
                    f"{e.get('max_rel', 0):.3g}): an accelerator function {why}; set io_shape_optimization: DISABLED, "
                    f"or bucket only dimensions it keeps apart" + ("" if found else evaluate.on_generated(m)))


STAGES = [
    ("sharding", _stage_sharding),
    ("quantize", _stage_quantize),
    ("select accelerator functions", _stage_select),
    ("place on XLA", _stage_place),
    ("bfloat16", _stage_bfloat16),
    ("batch in the graph", _stage_batch),
    ("I/O shapes", _stage_io_shapes),
]


def _batch_of(s: _State):
    sizes = {b.function: min(b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]]) for b in s.batched}
    return lambda name: sizes.get(name, 1)


def _costs(s: _State, model_dir: Path) -> None:
    batch_of = _batch_of(s)
    runner = trial.Trial(savedmodel.SavedModelFile(model_dir, s.model.proto, s.model.meta, s.model.functions))
    aliases = s.model.aliases
    cpu = trial.cpu_functions(s.model, set(s.accelerator))
    # an accelerator function the CPU part calls runs (and is counted) on its own; one only another
    # accelerator function calls compiles into that one's cluster (its cost is already in the caller's)
    called_from_cpu = set().union(*(savedmodel.callees(s.model, c) for c in cpu)) if cpu else set()
    live = savedmodel.live_functions(s.model)
    for name, how in s.accelerator.items():
        if name not in live:  # e.g. the float body of a quantized signature: nothing runs it
            s.report.functions.append(FunctionEntry(name, how + " (unused: nothing in the model calls it)", 0, 0,
                                                    [], 0, aliases.get(name), False))
            continue
        cost = runner.compile(name, batch_of(name))
        inside = sorted(a for a in s.accelerator if a != name and name in savedmodel.callees(s.model, a))
        s.report.functions.append(FunctionEntry(name, how, cost.flops, cost.bytes_accessed, cost.shapes,
                                                s.call_sites.get(name, 0), aliases.get(name),
                                                name in called_from_cpu, inside))
    s.report.cpu_functions = {k: v for k, v in trial.cpu_flops(s.model, cpu, batch_of, runner.renamed).items()}
    s.report.cpu_cost = sum(s.report.cpu_functions.values())
    s.report.cpu_ops = {name: _cpu_ops(s, name) for name in cpu}
    return runner


def _latency(s: _State, runner) -> None:
    """Each served accelerator function timed before (input model) and after (converted), here."""
    start = time.perf_counter()
    served = [f.name for f in s.report.served_functions]
    if served:
        original = savedmodel.read(s.report.input_model_dir)
        pairs, twin_of = [], {t: o for o, twins in s.model.twins.items() for t in twins}
        for name in served:
            before = twin_of.get(name, name)
            if before in original.functions:
                pairs.append((before, name))
        largest = {b.function: max(b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]]) for b in s.batched}
        cap = s.options.experimental.max_batch_bucket or buckets.DEFAULT_MAX_BATCH_BUCKET
        s.report.latency = latency.measure(trial.Trial(original), runner, pairs,
                                           lambda name: largest.get(name, min(latency.ROWS, cap)))
        s.report.machine = latency.machine()
    s.report.timings["latency"] = round(time.perf_counter() - start, 3)


_PLUMBING = {"NoOp", "Identity", "Const", "StatefulPartitionedCall", "PartitionedCall", "ReadVariableOp"}


def _cpu_ops(s: _State, name: str) -> dict:
    """The compute ops a CPU function runs itself, and why it is on the CPU."""
    from collections import Counter

    counts = Counter(n.op for n in s.model.functions[name].node_def if n.op not in _PLUMBING)
    if name.startswith(buckets.PREFIX):
        why = "kiln's I/O shape wrapper: pads inputs to a bucket and slices outputs on the CPU"
    elif name.startswith("__kiln_batched_"):
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
        batched = sorted({b.shared_name for b in s.batched if b.caller in below})
        sizes = sorted({n for b in s.batched if b.caller in below
                        for n in (b.attrs["allowed_batch_sizes"] or [b.attrs["max_batch_size"]])})
        sizes = sizes or sorted({n for b in s.bucketed if b.function in below for n in b.batch_buckets})
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


def _prepare_output(output_model_dir) -> tuple[Path, Path, list[Path]]:
    """(output, temporary directory next to it, parent directories created for it)."""
    out = Path(output_model_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"output_model_dir {str(out)!r} already exists and is not an empty directory")
    parent = out.parent if str(out.parent) else Path(".")
    created = []
    for missing in reversed([p for p in [parent, *parent.parents] if not p.exists()]):
        try:
            missing.mkdir()
        except OSError as exc:
            _remove_created(created)
            raise OutputError(f"cannot create {str(missing)!r}, a parent of output_model_dir: {exc.strerror}") from None
        created.append(missing)
    if not parent.is_dir():
        raise OutputError(f"the parent of output_model_dir {str(out)!r} is not a directory")
    tmp = parent / f".{out.name}.kiln-tmp-{uuid.uuid4().hex[:8]}"
    return out, tmp, created


def _remove_created(created: list[Path]) -> None:
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            break


def convert(input_model_dir, output_model_dir, options=None, *, evaluation_data=None) -> ConversionReport:
    """Convert; ``options`` is a ConverterOptions text proto or message; ``evaluation_data`` the real
    inputs the accuracy guard runs on ({signature: file or iterable of {input: array}}). Returns the
    report; warns (AccuracyNotMeasuredWarning) when a stage that can change results was not measured."""
    options = opts.coerce(options)
    model = savedmodel.read(input_model_dir)
    report = ConversionReport(str(input_model_dir), str(output_model_dir))
    state = _State(model, options, report, evaluation_data)
    out, tmp, created = _prepare_output(output_model_dir)
    try:
        with evaluate.Scratch() as state.scratch:
            for name, stage in STAGES:
                start = time.perf_counter()
                changes = stage(state)
                report.stages.append(StageEntry(name, "applied", changes, round(time.perf_counter() - start, 3)))
                report.timings[name] = report.stages[-1].seconds
            report.unmeasured = list(state.guard.unmeasured)
            report.accuracy_skipped = state.guard.skip
            _write(state, out, tmp)
    except BaseException:
        _remove_created(created)
        raise
    message = state.guard.warning()
    if message:
        warnings.warn(message, guard.AccuracyNotMeasuredWarning, stacklevel=2)
    ratio = latency.slower(report.latency)
    if ratio:
        warnings.warn(f"the converted functions run {ratio:.1f}x slower than the input's on this machine "
                      f"({report.machine}; see the report's latency lines). That is expected on a CPU: XLA's CPU "
                      f"backend and bfloat16 without native support are slower than TensorFlow's own kernels. "
                      f"The conversion targets accelerators (GPU, TPU): measure there before deploying",
                      latency.SlowerOnThisMachineWarning, stacklevel=2)
    return report


def _warmup(s: _State, path: Path) -> None:
    """Records TF Serving replays at load: never for a state-changing signature, only ones that run."""
    start = time.perf_counter()
    sizes = {key: info["warmup_batch_sizes"] for key, info in s.report.signatures.items()}
    stateful = {k: effects.describe(v) for k, v in effects.signature_effects(s.model).items()}
    samples = {key: s.guard.real_inputs(s.model, key) for key in sizes}
    dimensions = [(e.input, e.dimension, list(e.sizes)) for e in s.options.experimental.dimension_buckets] \
        if opts.enabled(s.options, "io_shape_optimization") else []
    requests, skipped = warmup.plan(s.model, sizes, samples, stateful, dimensions)
    requests, failed = warmup.verify(s.report.input_model_dir, requests, [k for k in sizes if not samples[k]])
    s.report.warmup_records = warmup.write_records(path, requests)
    s.report.warmup = {"records": {k: [list(next(iter(f.values())).shape) if f else [] for key, f in requests
                                       if key == k] for k in sorted({key for key, _ in requests})},
                       "real_inputs": sorted(k for k, v in samples.items() if v),
                       "skipped": skipped + failed}
    s.report.timings["warm-up records"] = round(time.perf_counter() - start, 3)


def _write(state: _State, out: Path, tmp: Path) -> None:
    model, report, options = state.model, state.report, state.options
    try:
        shutil.copytree(model.path, tmp, ignore=shutil.ignore_patterns("saved_model.pb"))
        (tmp / "saved_model.pb").write_bytes(model.proto.SerializeToString())
        _write_fingerprint(tmp)
        start = time.perf_counter()
        runner = _costs(state, tmp)  # trial compilation: raises before anything is published
        report.timings["costs"] = round(time.perf_counter() - start, 3)
        _latency(state, runner)
        report.signatures = _signatures(state)
        report.batching = [asdict(b) for b in state.batched]
        extra = tmp / "assets.extra"
        (extra / "kiln").mkdir(parents=True, exist_ok=True)
        _warmup(state, extra / warmup.WARMUP_FILE)
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
