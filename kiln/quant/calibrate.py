"""Calibration: run the float model over a representative dataset, keep every float
tensor's range.

As TensorFlow's calibrator (calibration_logger.cc): a plain running min/max over every
value of every sample — no averaging, no histogram — with variable tensors (LSTM state)
reset before each. The model runs on LiteRT's kernels when ai-edge-litert is installed
(TF's calibrator's kernels: TF's ranges to the bit, many times faster), else on kiln's
interpreter (kiln.quant.backends), and samples of one shape share a run — batched along
their leading dimension — wherever that gives each sample's values exactly.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..errors import KilnError
from ..ir import Model, Tensor
from ..schema import DType
from . import backends


class DatasetError(KilnError, ValueError):
    """A representative dataset that cannot calibrate the model (shape, dtype, NaN...)."""


@dataclass
class Range:
    min: float
    max: float

    def update(self, values: np.ndarray) -> None:
        finite = values[np.isfinite(values)] if not np.all(np.isfinite(values)) else values
        if finite.size:
            self.min = min(self.min, float(finite.min()))
            self.max = max(self.max, float(finite.max()))


def samples(dataset: Any) -> Iterator[Any]:
    """The samples of a TF-style representative dataset: a callable returning an iterable,
    an iterable, or a file (`kiln.quant.datasets`: an ``.npz`` whose arrays, keyed by input
    name, hold one sample per leading index, or a TFRecord of TF's RepresentativeDataSample)."""
    if isinstance(dataset, (str, os.PathLike)):
        from .datasets import read  # datasets imports DatasetError from here

        yield from read(dataset)
        return
    source = dataset() if callable(dataset) else dataset
    if not isinstance(source, Iterable):
        raise DatasetError("representative dataset: expected a callable returning an iterable of samples, "
                           f"an iterable or a .npz / TFRecord path, got {type(dataset).__name__}")
    yield from source


#: How to accept integer samples for a float input, named in the error that refuses them.
INTEGER_SAMPLES_HINT = ("normalise them as the model expects (e.g. x / 255), or pass allow_integer_samples=True "
                        "(CLI: --allow-integer-samples) if the raw integer values are what the model takes")


def input_labels(model: Model, inputs: list[Tensor]) -> list[str]:
    """Each input as users name it: its signature input name (as in a dataset's keys), else its
    tensor name."""
    named = {id(t): key for s in model.signatures if s.subgraph is model.main for key, t in s.inputs.items()}
    return [named.get(id(t), t.name) for t in inputs]


def _feeds(sample: Any, inputs: list[Tensor], index: int, *, allow_integer_samples: bool = False,
           labels: list[str] | None = None) -> list[np.ndarray]:
    """One sample as arrays in model-input order, checked against the inputs' signatures; errors
    name each input by its ``labels`` entry (see `input_labels`; default: tensor names).

    Integer (or boolean) arrays for a float input are refused unless ``allow_integer_samples``:
    they are almost always un-normalised data (uint8 images where the model takes [0, 1] or
    [-1, 1]), which calibrates every range wrong without a word (TF refuses them too)."""
    names = [t.name for t in inputs]
    labels = labels or names
    if isinstance(sample, dict):
        by_name = {_short(k, names): v for k, v in sample.items()}
        by_name.update({n: sample[label] for n, label in zip(names, labels) if label in sample})
        missing = [label for n, label in zip(names, labels) if n not in by_name]
        if missing:
            raise DatasetError(f"representative dataset, sample {index}: no value for input(s) {missing} "
                               f"(the model's inputs are {labels}; the sample has {sorted(sample)})")
        values = [by_name[n] for n in names]
    else:
        values = list(sample) if isinstance(sample, (list, tuple)) else [sample]
        if len(values) != len(inputs):
            one = ("; a .npy file holds one input's samples: give an .npz keyed by input name" if len(values) == 1
                   else "")
            raise DatasetError(f"representative dataset, sample {index}: {len(values)} arrays for "
                               f"{len(inputs)} model inputs {labels}{one}")
    out = []
    for t, label, v in zip(inputs, labels, values):
        arr = np.asarray(v)
        want = t.signature
        where = f"representative dataset, sample {index}, input {label!r}"
        if arr.ndim != len(want) or any(w >= 0 and w != d for w, d in zip(want, arr.shape)):
            raise DatasetError(f"{where}: shape {list(arr.shape)} does not fit the model's {list(want)}")
        if arr.dtype != t.dtype.numpy:
            if arr.dtype.kind in "iub" and t.dtype in (DType.FLOAT32, DType.FLOAT16) and not allow_integer_samples:
                raise DatasetError(f"{where}: dtype {arr.dtype} where the model takes {np.dtype(t.dtype.numpy)}; "
                                   f"integer samples for a float input are usually not normalised — "
                                   f"{INTEGER_SAMPLES_HINT}")
            if not (arr.dtype.kind == "f" and t.dtype in (DType.FLOAT32, DType.FLOAT16)) and \
                    not np.can_cast(arr.dtype, t.dtype.numpy, "same_kind"):
                raise DatasetError(f"{where}: dtype {arr.dtype} where the model takes {np.dtype(t.dtype.numpy)}")
            arr = arr.astype(t.dtype.numpy)
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise DatasetError(f"{where}: holds NaN or Inf; calibration needs finite values")
        out.append(arr)
    return out


def _short(key: str, names: list[str]) -> str:
    """Match a signature-style input name ("x") to a tensor name ("serving_default_x:0")."""
    if key in names:
        return key
    hits = [n for n in names if n.split(":")[0].endswith("_" + key) or n.split(":")[0] == key]
    return hits[0] if len(hits) == 1 else key


#: Called after each run with a function giving any tracked tensor's value — for a batch of
#: samples, their values stacked along the leading dimension (e.g. to record what happens
#: inside a fused op).
Observer = Callable[[Callable[[Tensor], np.ndarray]], None]


def _progress(iterator: Iterator, total: int | None, enabled: bool) -> Iterator:
    """A tqdm progress bar over the samples (tqdm is optional: none without it)."""
    if not enabled:
        return iterator
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterator
    return tqdm(iterator, desc="calibrating", unit="sample", total=total, leave=True)


def _count(dataset: Any, max_samples: int | None) -> int | None:
    """The number of samples, where the dataset says it without being consumed (a sized
    collection, an .npz's leading dimension): the bar then has a total and an ETA."""
    from .datasets import sample_count  # datasets imports DatasetError from here

    total = None if callable(dataset) else sample_count(dataset)
    if total is None:
        return max_samples
    return total if max_samples is None else min(total, max_samples)


def calibrate(model: Model, dataset: Any, *, progress: bool = True, max_samples: int | None = None,
              observers: Iterable[Observer] = (), allow_integer_samples: bool = False,
              backend: str = "auto") -> dict[int, Range]:
    """Ranges of the main subgraph's float tensors, keyed by ``id(tensor)`` of ``model``
    (``allow_integer_samples``: see `_feeds`; ``backend``: "auto" (LiteRT if it runs the
    model, else kiln), "litert" or "kiln")."""
    sg = model.main
    inputs = list(sg.inputs)
    given = {id(t) for t in inputs}
    tracked = [t for t in sg.tensors if t.dtype == DType.FLOAT32 and not t.is_constant and
               (t.producer is not None or t.is_variable or id(t) in given)]   # not a dangling tensor
    ranges = [Range(np.inf, -np.inf) for _ in tracked]
    slot = {id(t): k for k, t in enumerate(tracked)}
    observers = list(observers)
    runner = backends.runner_for(model, tracked, backend)
    batch_size = backends.batch_size(tracked)
    batching: bool | None = None if batch_size > 1 else False     # None: not tried yet

    def record(values: list[np.ndarray]) -> None:
        for r, v in zip(ranges, values):
            r.update(v)
        for observe in observers:
            observe(lambda t: values[slot[id(t)]])

    def run(group: list[list[np.ndarray]]) -> None:
        nonlocal batching
        stacked = backends.stack(group) if batching is not False and len(group) > 1 else None
        if stacked is not None and batching is None:   # the first batch: check it against its first sample
            alone = runner.run(group[0])
            try:
                batched = runner.run(stacked)
            except Exception:   # the model does not take a batch (a RESHAPE to a fixed shape, ...)
                batched = None
            batching = batched is not None and backends.same_as_alone(batched, alone, len(group))
            if batching:
                record(batched)
            else:
                record(alone)
                for feeds in group[1:]:
                    record(runner.run(feeds))
            return
        if stacked is not None:
            record(runner.run(stacked))
            return
        for feeds in group:
            record(runner.run(feeds))

    count = 0
    group: list[list[np.ndarray]] = []
    labels = input_labels(model, inputs)
    source = samples(dataset)
    first = next(source, None)   # read and checked before the progress bar is drawn
    if first is not None:
        _feeds(first, inputs, 0, allow_integer_samples=allow_integer_samples, labels=labels)
        source = itertools.chain([first], source)
    iterator = _progress(source, _count(dataset, max_samples), progress and first is not None)
    for index, sample in enumerate(iterator):
        if max_samples is not None and index >= max_samples:
            break
        feeds = _feeds(sample, inputs, index, allow_integer_samples=allow_integer_samples, labels=labels)
        if group and [a.shape for a in feeds] != [a.shape for a in group[0]]:
            run(group)
            group = []
        group.append(feeds)
        count += 1
        if len(group) >= (batch_size if batching is not False else 1):
            run(group)
            group = []
    if group:
        run(group)
    if count == 0:
        raise DatasetError("representative dataset: no samples")
    return {id(t): r for t, r in zip(tracked, ranges) if r.min <= r.max}
