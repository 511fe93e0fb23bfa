"""`kiln.QuantizationDebugger`: where a quantized model loses accuracy, and what to keep float.

TensorFlow's ``tf.lite.experimental.QuantizationDebugger`` needs the converter object and
handles int8 only. This one takes any float .tflite and any quantized version of it (kiln's
or TensorFlow's; int8, 16x8, dynamic range, float16, weight-only), runs both over a dataset
and reports, per quantized op output:

- cumulative error: the tensor dequantized vs the float model's tensor, both models run
  end to end — what the model has lost up to that point;
- layer-wise error: the op cut out and run alone on the float model's inputs, quantized with
  its input parameters, vs the float op run on the same (dequantized) inputs — what this op
  adds, so that the op adding the most error is named even when it sits early in the model.

``suggest_denylist`` then keeps ops float, worst first, re-quantizing with `kiln.quantize`
until the model meets an error target, and drops the ops that turn out not to be needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ...errors import KilnError
from ...format import read_model, write_model
from ...ir import Model, Operator, Tensor
from ...schema import DType
from ..calibrate import DatasetError, _feeds, input_labels, samples
from .match import Matching, constant_derived, match, real_valued
from .run import is_quantized, isolate, real_values, resolve_runner, stored_values

#: Model-level metrics ``suggest_denylist`` can aim at (the worst over the model's outputs).
TARGET_METRICS = ("max_abs_error", "rmse", "relative_error")


class Errors:
    """Running error statistics of a tensor against its float reference, over all samples;
    ``metrics`` holds the per-sample mean of each user metric ``fn(float, dequantized)``."""

    def __init__(self, custom: dict | None = None):
        self.count = 0
        self.sum_error = self.sum_squared = self.sum_squared_ref = 0.0
        self.max_abs_error = 0.0
        self.custom = custom or {}
        self._sums = {name: [0.0, 0] for name in self.custom}

    @property
    def metrics(self) -> dict[str, float]:
        return {name: total / n if n else float("nan") for name, (total, n) in self._sums.items()}

    def add(self, got: np.ndarray, ref: np.ndarray) -> None:
        got = np.asarray(got, np.float64)
        ref = np.asarray(ref, np.float64).reshape(got.shape)   # a reshape one model folded away
        for name, fn in self.custom.items():
            try:
                value = float(fn(ref, got))
            except Exception as exc:   # the user's function: say which one failed
                raise KilnError(f"QuantizationDebugger: metric {name!r} failed: {type(exc).__name__}: {exc}") \
                    from exc
            self._sums[name][0] += value
            self._sums[name][1] += 1
        diff = got - ref
        finite = np.isfinite(diff)
        if not finite.all():  # a NaN/Inf the float model made too tells nothing about quantization
            diff, ref = diff[finite], ref[finite]
        self.count += diff.size
        self.sum_error += float(diff.sum())
        self.sum_squared += float(np.square(diff).sum())
        self.sum_squared_ref += float(np.square(ref).sum())
        if diff.size:
            self.max_abs_error = max(self.max_abs_error, float(np.abs(diff).max()))

    @property
    def rmse(self) -> float:
        return (self.sum_squared / self.count) ** 0.5 if self.count else 0.0

    @property
    def mean_error(self) -> float:
        return self.sum_error / self.count if self.count else 0.0

    @property
    def relative_error(self) -> float:
        """RMSE over the RMS of the float values (0 when both are 0)."""
        ref = (self.sum_squared_ref / self.count) ** 0.5 if self.count else 0.0
        return self.rmse / ref if ref > 0 else (0.0 if self.rmse == 0 else float("inf"))


@dataclass
class TensorReport:
    """One quantized op's output: its parameters and its errors against the float model."""

    op_index: int
    op: str
    tensor: str
    float_tensor: str
    dtype: str
    scale: float | None
    zero_point: int | None
    elements: int
    cumulative: Errors = field(default_factory=Errors)
    layer: Errors | None = None
    #: The float op's output name: what a denylist names to keep this op float (None for
    #: QUANTIZE ops the quantizer inserted).
    denylist_name: str | None = None
    note: str = ""

    @property
    def rmse_over_scale(self) -> float | None:
        """Cumulative RMSE in quantization steps (≈ 0.29 is rounding alone)."""
        return self.cumulative.rmse / self.scale if self.scale else None

    @property
    def added_error(self) -> float:
        """What ranks ops: layer-wise relative error, else cumulative."""
        return (self.layer or self.cumulative).relative_error


@dataclass
class OutputReport:
    """One model output: errors vs the float model, and top-1 agreement for distributions."""

    name: str
    errors: Errors
    top1_agreement: float | None = None


@dataclass
class DenylistSuggestion:
    """What `QuantizationDebugger.suggest_denylist` found: the ops to keep float, the error
    the re-quantized model reaches, and the model itself."""

    denylist: list[str]
    ops: list[tuple[str, str]]
    error: float
    target: float
    metric: str
    reached: bool
    model: bytes
    #: (denylist tried, error measured), in the order tried.
    trials: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


def _load(model: Any, what: str) -> tuple[bytes, Model]:
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                model = f.read()
        except OSError as exc:
            raise KilnError(f"QuantizationDebugger: cannot read the {what} model {path!r}: {exc}") from exc
    if isinstance(model, Model):
        model = write_model(model)
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        return data, read_model(data)
    raise KilnError(f"QuantizationDebugger: the {what} model must be .tflite bytes, a path or a kiln Model, "
                    f"got {type(model).__name__}")


def detect_mode(model: Model) -> str:
    """The `kiln.quantize` mode a quantized model looks made with."""
    sg = model.main
    activations = [t for t in sg.tensors if not t.is_constant and is_quantized(t)]
    if any(t.dtype == DType.INT16 for t in activations):
        return "int16x8"
    if activations:
        return "int8"
    constants = {t.dtype for t in sg.tensors if t.is_constant}
    dequantized = {op.inputs[0].dtype for op in sg.operators
                   if op.op_type == "DEQUANTIZE" and op.inputs[0] is not None and op.inputs[0].is_constant}
    if DType.FLOAT16 in dequantized:
        return "float16"
    if DType.INT8 in dequantized:
        return "weight_only"
    if DType.INT8 in constants:
        return "dynamic"
    raise KilnError("QuantizationDebugger: the quantized model holds no quantized tensor; "
                    "pass mode= to say how to re-quantize")


def _io_type(t: Tensor) -> str:
    return {DType.INT8: "int8", DType.UINT8: "uint8"}.get(t.dtype, "float32")


def _is_distribution(ref: np.ndarray) -> bool:
    return ref.ndim >= 1 and ref.shape[-1] > 1 and bool(np.all(ref >= 0) and np.all(ref <= 1)) and \
        bool(np.allclose(ref.sum(axis=-1), 1.0, atol=1e-3))


class QuantizationDebugger:
    """Compare a quantized model with its float original, tensor by tensor.

    Args:
      float_model / quantized_model: .tflite bytes, paths or kiln Models.
      dataset: samples as for `kiln.quantize` (a callable returning an iterable, an iterable,
        or an .npz or TFRecord path, as kiln.quant.datasets reads), float values in the float model's input order.
      runner: ``"kiln"`` (kiln's Interpreter), ``"litert"`` (LiteRT's reference kernels) or a
        callable (see kiln.quant.debug.run).
      max_samples: use at most this many samples.
      layer_wise: also run every op alone (the layer-wise error); False skips it.
      metrics: extra metrics, ``{name: fn(float_values, dequantized_values) -> float}``,
        averaged over samples for every tensor (cumulative and layer-wise) and output
        (TensorFlow's debugger's ``layer_debug_metrics`` / ``model_debug_metrics``).
      allow_integer_samples: accept integer samples for float inputs (as `kiln.quantize`).

    Raises:
      MismatchError: the models' inputs or outputs differ.
      DatasetError: a sample does not fit the float model, or there is none.
    """

    def __init__(self, float_model, quantized_model, dataset, *, runner="kiln", max_samples: int | None = None,
                 layer_wise: bool = True, metrics: dict | None = None, allow_integer_samples: bool = False):
        self.float_bytes, self.float_model = _load(float_model, "float")
        self.quantized_bytes, self.quantized_model = _load(quantized_model, "quantized")
        self.runner = resolve_runner(runner)
        self.layer_wise = layer_wise
        self.metrics = dict(metrics or {})
        bad = [name for name, fn in self.metrics.items() if not callable(fn)]
        if bad:
            raise KilnError(f"QuantizationDebugger: metrics {bad} are not callables fn(float, dequantized)")
        self.matching: Matching = match(self.float_model.main, self.quantized_model.main)
        inputs = list(self.float_model.main.inputs)
        labels = input_labels(self.float_model, inputs)
        self.samples: list[list[np.ndarray]] = []
        for index, sample in enumerate(samples(dataset)):
            if max_samples is not None and index >= max_samples:
                break
            self.samples.append(_feeds(sample, inputs, index, allow_integer_samples=allow_integer_samples,
                                       labels=labels))
        if not self.samples:
            raise DatasetError("QuantizationDebugger: the dataset has no samples")
        self._tensors: list[TensorReport] | None = None
        self._outputs: list[OutputReport] | None = None

    # -- results -------------------------------------------------------------------------------
    @property
    def tensors(self) -> list[TensorReport]:
        """One row per quantized op output that has a float counterpart, in op order."""
        if self._tensors is None:
            self.run()
        return self._tensors

    @property
    def outputs(self) -> list[OutputReport]:
        """Model-level errors, one per model output."""
        if self._outputs is None:
            self.run()
        return self._outputs

    @property
    def unmatched(self) -> list[tuple[str, str, str]]:
        """Quantized ops (type, output, reason) with no float counterpart: not measured."""
        return self.matching.unmatched

    def worst_ops(self, count: int = 5) -> list[TensorReport]:
        """The rows adding the most error (layer-wise relative error), worst first."""
        return sorted(self.tensors, key=lambda r: -r.added_error)[:count]

    def model_error(self, metric: str = "max_abs_error") -> float:
        """The worst of ``metric`` over the model's outputs."""
        return _model_error(self.outputs, metric)

    # -- output --------------------------------------------------------------------------------
    def table(self) -> str:
        """A text table of every measured tensor, then the model outputs and the worst op."""
        from .report import text_table

        return text_table(self)

    def to_csv(self, path=None) -> str:
        """The rows as CSV (written to ``path`` when given); returns the text."""
        from .report import csv_text

        return _save(csv_text(self), path)

    def to_html(self, path=None) -> str:
        """A self-contained HTML page (per-op error chart, tables), written to ``path`` when given."""
        from .report import html_page

        return _save(html_page(self), path)

    # -- keeping ops float ---------------------------------------------------------------------
    def suggest_denylist(self, target_error: float, *, metric: str = "max_abs_error", mode: str | None = None,
                         max_ops: int | None = None, base_denylist: Iterable[str] = (),
                         **quantize_options) -> DenylistSuggestion:
        """The smallest set of ops to keep float so the model's ``metric`` (worst over its
        outputs) is at most ``target_error``.

        Greedy: the float model is re-quantized with `kiln.quantize` (``mode`` as detected
        from the quantized model unless given, its I/O types kept, ``quantize_options``
        passed on) with ops denylisted worst layer-wise error first — 1, 2, 4... more at a
        time — and re-measured until the target is met; then chosen ops are dropped again (in
        halves, quarters..., then one by one) while the target still holds, so no op of the
        result can be left out. When even all
        candidates (at most ``max_ops``) do not reach the target, ``reached`` is False.
        ``base_denylist`` is kept float in every trial; the answer lists what it adds.
        """
        if metric not in TARGET_METRICS:
            raise KilnError(f"suggest_denylist: unknown metric {metric!r}; use one of {', '.join(TARGET_METRICS)}")
        try:
            target = float(target_error)
        except (TypeError, ValueError):
            target = float("nan")
        if not np.isfinite(target) or target < 0:
            raise KilnError(f"suggest_denylist: target_error must be a finite number ≥ 0, got {target_error!r}")
        target_error = target
        from ..api import quantize as requantize

        mode = mode or detect_mode(self.quantized_model)
        qsg = self.quantized_model.main
        options = {"progress": False, **quantize_options}
        if mode in ("int8", "int16x8"):
            options.setdefault("representative_dataset", self.samples)
            options.setdefault("inference_input_type", _io_type(qsg.inputs[0]))
            options.setdefault("inference_output_type", _io_type(qsg.outputs[0]))
        base = list(base_denylist)
        trials: list[tuple[tuple[str, ...], float]] = []
        cache: dict[frozenset, tuple[float, bytes]] = {}

        def measure(names: list[str]) -> float:
            key = frozenset(names)
            if key not in cache:
                model = requantize(self.float_bytes, mode, denylist=base + list(names), **options)
                cache[key] = (self._error_of(model, metric), model)
                trials.append((tuple(names), cache[key][0]))
            return cache[key][0]

        order: list[TensorReport] = []
        for row in self.worst_ops(len(self.tensors)):
            if row.denylist_name is not None and row.denylist_name not in base and \
                    row.denylist_name not in {r.denylist_name for r in order}:
                order.append(row)
        order = order[:max_ops] if max_ops is not None else order
        chosen: list[str] = []
        error = measure(chosen)   # kiln's own quantization is the baseline the denylist improves on
        step, taken = 1, 0
        while error > target_error and taken < len(order):   # 1, 2, 4... more ops at a time
            chosen += [r.denylist_name for r in order[taken:taken + step]]
            taken += step
            step *= 2
            error = measure(chosen)
        if error <= target_error:
            chosen = self._prune(chosen, lambda names: measure(names) <= target_error)
        error = measure(chosen)
        kinds = {r.denylist_name: r.op for r in order}
        return DenylistSuggestion(chosen, [(kinds[n], n) for n in chosen], error, target_error, metric,
                                  error <= target_error, cache[frozenset(chosen)][1], trials)

    @staticmethod
    def _prune(chosen: list[str], good) -> list[str]:
        """Drop what ``good`` does not need: halves, quarters... of ``chosen`` first (greedy
        search overshoots when the op that matters ranks late), then single ops until none
        can go."""
        size = len(chosen) // 2
        while size > 1:
            start = 0
            while start < len(chosen):
                fewer = chosen[:start] + chosen[start + size:]
                if fewer != chosen and good(fewer):
                    chosen = fewer
                else:
                    start += size
            size //= 2
        dropped = True
        while dropped:
            dropped = False
            for name in list(reversed(chosen)):
                fewer = [n for n in chosen if n != name]
                if good(fewer):
                    chosen, dropped = fewer, True
        return chosen

    def _error_of(self, model: bytes, metric: str) -> float:
        """``metric`` of ``model``'s outputs against the float model's, over the dataset."""
        ir = read_model(model)
        fsg, qsg = self.float_model.main, ir.main
        f_out = [i for t in fsg.outputs for i, u in enumerate(fsg.tensors) if u is t]
        q_out = [i for t in qsg.outputs for i, u in enumerate(qsg.tensors) if u is t]
        stats = [OutputReport(t.name, Errors()) for t in fsg.outputs]
        float_session, quant_session = self.runner(self.float_bytes), self.runner(model)
        for feeds in self.samples:
            fv = float_session(feeds, f_out)
            qv = quant_session([stored_values(t, x) for t, x in zip(qsg.inputs, feeds)], q_out)
            for s, fi, qi, q in zip(stats, f_out, q_out, qsg.outputs):
                s.errors.add(real_values(q, qv[qi]), fv[fi])
        return _model_error(stats, metric)

    # -- measuring -----------------------------------------------------------------------------
    def run(self) -> None:
        """Run both models (and every op alone) over the dataset and fill the reports."""
        fsg, qsg = self.float_model.main, self.quantized_model.main
        ctx = _Context(self.matching, fsg, qsg)
        sites = [site for op_index, op in enumerate(qsg.operators)
                 if (site := self._site(op_index, op, ctx)) is not None]
        f_wanted = {ctx.f_pos[id(f)] for f in self.matching.float_of.values()}
        f_wanted |= {ctx.f_pos[id(t)] for t in fsg.outputs} | {ctx.f_pos[i] for i in ctx.f_derived}
        q_wanted = {ctx.q_pos[id(q)] for site in sites for _, q, _ in site.rows}
        q_wanted |= {ctx.q_pos[id(t)] for t in qsg.outputs} | {ctx.q_pos[i] for i in ctx.q_derived}
        for site in sites:   # what the ops run alone are fed (shapes read from the runs)
            q_wanted |= {ctx.q_pos[id(t)] for t in site.q_op.inputs if t is not None and not t.is_constant}
            if site.f_op is not None:
                f_wanted |= {ctx.f_pos[id(t)] for t in site.f_op.inputs if t is not None and not t.is_constant}
        outputs = [OutputReport(f.name, Errors(self.metrics)) for f in fsg.outputs]
        agree = [[0, 0, True] for _ in outputs]   # agreeing rows, rows, every float value a distribution
        float_session, quant_session = self.runner(self.float_bytes), self.runner(self.quantized_bytes)
        for feeds in self.samples:
            fv = float_session(feeds, f_wanted)
            qv = quant_session([stored_values(t, x) for t, x in zip(qsg.inputs, feeds)], q_wanted)
            for site in sites:
                for row, q, f in site.rows:
                    got, ref = qv.get(ctx.q_pos[id(q)]), fv.get(ctx.f_pos[id(f)])
                    if got is None or ref is None:
                        row.note = row.note or "the runner holds no value for it"
                    else:
                        row.cumulative.add(real_values(q, got), ref)
                if site.alone is not None:
                    site.layer_sample(ctx, fv, qv)
            for k, (f, q) in enumerate(zip(fsg.outputs, qsg.outputs)):
                ref, got = fv[ctx.f_pos[id(f)]], real_values(q, qv[ctx.q_pos[id(q)]])
                outputs[k].errors.add(got, ref)
                a = agree[k]
                if ref.ndim >= 1 and ref.shape[-1] > 1:
                    a[0] += int(np.sum(np.argmax(got, -1) == np.argmax(ref, -1)))
                    a[1] += int(np.prod(ref.shape[:-1]))
                a[2] = a[2] and _is_distribution(ref)
        for out, (same, total, dist) in zip(outputs, agree):
            out.top1_agreement = same / total if dist and total else None
        self._tensors = [row for site in sites for row, _, _ in site.rows]
        self._outputs = outputs

    def _site(self, op_index: int, q_op: Operator, ctx: "_Context") -> "_Site | None":
        """The rows of one quantized op and, for the layer-wise error, its op alone."""
        f_op = ctx.partner.get(id(q_op))
        if f_op is None:
            source = q_op.inputs[0] if q_op.inputs else None
            out = q_op.outputs[0] if q_op.outputs else None
            # An inserted QUANTIZE: its rounding is error the model adds here.
            if q_op.op_type != "QUANTIZE" or out is None or not is_quantized(out) or source is None or \
                    id(source) not in self.matching.float_of:
                return None
            pairs = [(out, self.matching.float_of[id(out)])]
        else:
            # Only real values: shape arithmetic (SHAPE, FILL on int32...) is exact on both sides.
            pairs = [(q, f) for q, f in zip(q_op.outputs, f_op.outputs) if q is not None and f is not None
                     and f.dtype in (DType.FLOAT32, DType.FLOAT16)]
            if not pairs:
                return None
        rows = []
        for q, f in pairs:
            qp = q.quantization if is_quantized(q) else None
            rows.append((TensorReport(
                op_index, q_op.op_type, q.name, f.name, q.dtype.name,
                None if qp is None or qp.per_channel else float(qp.scale[0]),
                None if qp is None or qp.per_channel else int(qp.zero_point[0]), int(np.prod(q.shape)),
                denylist_name=None if f_op is None else f_op.outputs[0].name, cumulative=Errors(self.metrics)), q, f))
        site = _Site(q_op, f_op, rows)
        if self.layer_wise:
            site.prepare(self.runner, ctx, self.metrics)
        return site


class _Context:
    """Positions and pairings both models' runs are read through."""

    def __init__(self, matching: Matching, fsg, qsg):
        self.float_of = matching.float_of
        self.partner = {id(q): f for q, f in matching.ops}
        self.f_pos = {id(t): i for i, t in enumerate(fsg.tensors)}
        self.q_pos = {id(t): i for i, t in enumerate(qsg.tensors)}
        self.f_derived, self.q_derived = constant_derived(fsg), constant_derived(qsg)

    def q_own(self, t: Tensor) -> bool:
        """An input an op run alone takes from its own model's run, not from the float model:
        weights computed from constants, shape arithmetic."""
        return id(t) in self.q_derived or not real_valued(t)

    def f_own(self, t: Tensor) -> bool:
        return id(t) in self.f_derived or not real_valued(t)


class _Site:
    """One measured quantized op: (row, quantized tensor, float tensor) per output, and the
    op (with its float op) cut out to measure the error it adds."""

    def __init__(self, q_op: Operator, f_op: Operator | None, rows: list):
        self.q_op, self.f_op, self.rows = q_op, f_op, rows
        self.alone = None

    def _note(self, text: str) -> None:
        for row, _, _ in self.rows:
            row.note, row.layer = text, None
        self.alone = None

    def prepare(self, runner, ctx: _Context, metrics: dict) -> None:
        q_alone = isolate(self.q_op)
        f_alone = isolate(self.f_op) if self.f_op is not None else None
        if q_alone is None or (self.f_op is not None and f_alone is None):
            return self._note("calls other subgraphs: no layer-wise error")
        q_acts = [p for p in q_alone.fed if not ctx.q_own(self.q_op.inputs[p])]
        if any(id(self.q_op.inputs[p]) not in ctx.float_of for p in q_acts):
            return self._note("an input has no float counterpart: no layer-wise error")
        if f_alone is not None:
            f_acts = [p for p in f_alone.fed if not ctx.f_own(self.f_op.inputs[p])]
            if len(f_acts) != len(q_acts):
                return self._note("the float op reads other inputs: no layer-wise error")
        try:
            self.alone = (runner(q_alone.model), q_alone,
                          None if f_alone is None else runner(f_alone.model), f_alone)
        except (KilnError, RuntimeError, ValueError) as exc:
            return self._note(f"cannot run alone: {exc}")
        for row, _, _ in self.rows:
            row.layer = Errors(metrics)

    def layer_sample(self, ctx: _Context, fv: dict, qv: dict) -> None:
        """One sample's layer-wise error: the quantized op alone on the float model's inputs
        (quantized with its input parameters) vs the float op on those inputs dequantized."""
        q_session, q_alone, f_session, f_alone = self.alone
        feeds, real_inputs = [], []
        for p in q_alone.fed:
            t = self.q_op.inputs[p]
            stored = qv.get(ctx.q_pos[id(t)])
            own = ctx.q_own(t)
            real = None if own else fv.get(ctx.f_pos[id(ctx.float_of[id(t)])])
            if stored is None or (real is None and not own):
                return self._note("the runner holds no value for an input: no layer-wise error")
            if own:   # weights the quantized model computes (DEQUANTIZE), shapes
                feeds.append(stored)
                continue
            value = stored_values(t, real.reshape(stored.shape))
            feeds.append(value)
            real_inputs.append(real_values(t, value))
        try:
            got = q_session(feeds, [i for i in q_alone.outputs if i is not None])
            if f_session is None:   # QUANTIZE: the reference is its input's value
                refs = real_inputs[:1]
            else:
                acts = iter(real_inputs)
                f_feeds = [fv[ctx.f_pos[id(t)]] if ctx.f_own(t) else
                           next(acts).reshape(fv[ctx.f_pos[id(t)]].shape).astype(t.dtype.numpy)
                           for t in (self.f_op.inputs[p] for p in f_alone.fed)]
                ref = f_session(f_feeds, [i for i in f_alone.outputs if i is not None])
                refs = [ref[i] for i in f_alone.outputs if i is not None]
            outs = [got[i] for i in q_alone.outputs if i is not None]
        except KeyError:
            return self._note("the runner holds no value for a tensor: no layer-wise error")
        except (KilnError, RuntimeError, ValueError) as exc:
            return self._note(f"cannot run alone: {exc}")
        for (row, q, _), value, ref in zip(self.rows, outs, refs):
            row.layer.add(real_values(q, value), ref)


def _save(text: str, path) -> str:
    if path is not None:
        try:
            with open(os.fspath(path), "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise KilnError(f"QuantizationDebugger: cannot write {os.fspath(path)!r}: {exc}") from exc
    return text


def _model_error(outputs: Iterable[OutputReport], metric: str) -> float:
    if metric not in TARGET_METRICS:
        raise KilnError(f"unknown metric {metric!r}; use one of {', '.join(TARGET_METRICS)}")
    return max((getattr(o.errors, metric) for o in outputs), default=0.0)
