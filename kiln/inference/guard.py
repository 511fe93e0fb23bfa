"""The accuracy guard: every stage that can change results is measured, on real inputs when given.

Generated inputs (normal floats, small integer ids, empty strings) say little about a model that
parses text or reads an attention mask, so the user can give real ones: per signature, a file in
kiln's quantization dataset formats (a TFRecord of ``RepresentativeDataSample``, an ``.npz``; read
by ``kiln.quant.datasets``) or, from Python, an iterable of ``{input: array}``. The guard is
optional (``skip_accuracy_check: true``, ``--skip_accuracy_check``): the stages then apply without
a measurement and the report says so. It never passes silently: a stage whose error could not be
measured on some signature (its inputs do not run) is listed in ``unmeasured``, and the caller
warns and the CLI exits non-zero unless the check was skipped.
"""

from __future__ import annotations

import os

import numpy as np

from ..quant import datasets
from . import evaluate
from .options import OptionsError
from .quantize import check_inputs

#: the most samples of a dataset the measurements run (each measured model runs all of them)
MAX_SAMPLES = 16


class AccuracyNotMeasuredWarning(UserWarning):
    """A stage that can change results was applied without a measured error."""


def user_data(evaluation_data, option_files: dict, model) -> dict:
    """signature -> source, from ``convert(evaluation_data=...)`` and ``experimental.evaluation_datasets``.

    ``evaluation_data`` is ``{signature: path or iterable}``, or one path / iterable for the model's
    only signature (or ``serving_default``)."""
    given = {}
    if isinstance(evaluation_data, dict):
        unknown = sorted(set(evaluation_data) - set(model.signatures))
        if unknown:
            raise OptionsError(f"evaluation_data: {unknown} are not signatures of the model "
                               f"{sorted(model.signatures)} (give {{signature: file or iterable of samples}})")
        given = dict(evaluation_data)
    elif evaluation_data is not None:
        keys = sorted(model.signatures)
        key = "serving_default" if "serving_default" in keys else (keys[0] if len(keys) == 1 else None)
        if key is None:
            raise OptionsError(f"evaluation_data: the model has several signatures {keys}; give "
                               f"{{signature: file or iterable of samples}}")
        given = {key: evaluation_data}
    unknown = sorted(set(option_files) - set(model.signatures))
    if unknown:
        raise OptionsError(f"experimental.evaluation_datasets: {unknown} are not signatures of the model "
                           f"{sorted(model.signatures)}")
    for key, path in option_files.items():
        given.setdefault(key, path)
    return given


def load_user_data(given: dict, model) -> dict:
    """signature -> samples, read and checked against the signatures."""
    out = {}
    for key, source in sorted(given.items()):
        path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
        what = f"evaluation dataset {path!r} (signature {key!r})" if path else f"evaluation data for {key!r}"
        samples = datasets.load(source, what=what, progress=False, min_samples=1)
        check_inputs(samples, model.meta.signature_def[key], path or f"evaluation data for {key!r}")
        out[key] = samples
    return out


def batches(samples: list, sizes=evaluate.GENERATED_ROWS) -> list[dict]:
    """Consecutive samples of equal non-batch shapes concatenated into batches of ``sizes`` rows (not
    powers of two, so padding is exercised); samples that do not stack stay as they are."""
    out, i = [], 0
    samples = samples[:MAX_SAMPLES]
    for want in sizes:
        if i >= len(samples):
            break
        group, rows = [samples[i]], _rows(samples[i])
        i += 1
        while i < len(samples) and rows < want and _stacks(group[0], samples[i]):
            group.append(samples[i])
            rows += _rows(samples[i])
            i += 1
        out.append({k: np.concatenate([np.asarray(g[k]) for g in group]) if len(group) > 1 else g0
                    for k, g0 in group[0].items()})
    # a few more with shapes not seen yet (other lengths): every new shape is one more XLA compilation
    # per measured model, so samples that only repeat a shape add time and no coverage
    seen = {_shape_of(b) for b in out}
    for sample in samples[i:]:
        if len(out) >= len(sizes) + 4:
            break
        if _shape_of(sample) not in seen:
            seen.add(_shape_of(sample))
            out.append(sample)
    return out


def _shape_of(sample: dict) -> tuple:
    return tuple(sorted((k, np.shape(v)[1:]) for k, v in sample.items()))


def _rows(sample: dict) -> int:
    first = np.asarray(next(iter(sample.values())))
    return int(first.shape[0]) if first.ndim else 1


def _stacks(a: dict, b: dict) -> bool:
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b.get(k))
        if x.ndim == 0 or x.ndim != y.ndim or x.shape[1:] != y.shape[1:] or x.dtype != y.dtype:
            return False
    return True


class Guard:
    """Per-stage measurements, the inputs they run on, and what could not be measured."""

    def __init__(self, model, options, evaluation_data=None):
        self.skip = bool(options.skip_accuracy_check)
        given = user_data(evaluation_data, dict(options.experimental.evaluation_datasets), model)
        self.user = load_user_data(given, model)  # read now: a bad file fails before anything is done
        self.held_out: dict = {}  # signature -> quantization samples kept out of calibration
        self._inputs = None
        self.reference = None  # outputs of the model as the last measured stage left it
        self.unmeasured: list[dict] = []  # {"stage", "signature", "why"}

    def user_samples(self, model) -> dict:
        return self.user

    def inputs(self, model) -> dict:
        """signature -> (feeds, source) the measurements run on."""
        if self._inputs is None:
            user = self.user_samples(model)
            self._inputs = {}
            for key in sorted(model.signatures):
                if key in user:
                    self._inputs[key] = (batches(user[key]), "evaluation data")
                elif self.held_out.get(key):
                    self._inputs[key] = (batches(self.held_out[key]), "held-out representative samples")
                else:
                    self._inputs[key] = (evaluate.generated_inputs(model.meta.signature_def[key]), "generated inputs")
        return self._inputs

    def real_inputs(self, model, key: str) -> list | None:
        """The user's (or held-out representative) samples of a signature; None when only generated."""
        samples = self.user_samples(model).get(key) or self.held_out.get(key)
        return list(samples) if samples else None

    def measure(self, stage: str, model, before_dir, after_dir: str, keys, remedy: str, runner=None,
                keep_reference: bool = False):
        """{signature: measurement} on ``keys`` (the signatures the stage changed), or None when skipped.

        ``runner``: how the model after runs (evaluate.measure); ``keep_reference``: its outputs are not the
        next stage's reference (a probe, not the model as served). Signatures the model before the stage
        cannot run on these inputs are recorded as unmeasured;
        a model after the stage that fails where the one before runs is a StageError."""
        if self.skip:
            return None
        keys = set(keys)
        inputs = {k: v for k, v in self.inputs(model).items() if k in keys}
        measured, after = evaluate.measure(before_dir, after_dir, inputs, stage, remedy, self.reference, runner)
        if not keep_reference:
            self.reference = {**(self.reference or {}), **after}
        for key, m in sorted(measured.items()):
            if "error" in m:
                why = f"the model before {stage} fails on {m['source']} inputs: {m['error']}"
                self.unmeasured.append({"stage": stage, "signature": key, "why": why})
        return measured

    def lines(self, measured, label: str) -> list[str]:
        if measured is None:
            return [f"{label}: not measured (skip_accuracy_check)"]
        return [f"{label}: {line}" for line in evaluate.summary(measured)]

    def warning(self) -> str | None:
        """The loud message when something was applied unmeasured (None when all was, or when skipped)."""
        if self.skip or not self.unmeasured:
            return None
        which = "; ".join(f"{u['stage']} on signature {u['signature']!r} ({u['why']})" for u in self.unmeasured)
        return (f"the error of these stages was NOT measured, so they may have changed results unnoticed: "
                f"{which}. Give real inputs (--evaluation_data SIGNATURE=FILE, convert(evaluation_data=...) or "
                f"experimental.evaluation_datasets: a TFRecord of RepresentativeDataSample or an .npz) or accept "
                f"the risk with skip_accuracy_check: true / --skip_accuracy_check")
