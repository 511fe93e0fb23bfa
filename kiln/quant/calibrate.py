"""Calibration: run the float model over a representative dataset, keep every float
tensor's range.

As TensorFlow's calibrator (calibration_logger.cc): a plain running min/max over every
value of every sample — no averaging, no histogram. Samples run one by one through kiln's
own interpreter, with variable tensors (LSTM state) reset before each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..errors import KilnError
from ..ir import Model, Tensor
from ..runtime import Interpreter
from ..schema import DType


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


def _feeds(sample: Any, inputs: list[Tensor], index: int) -> list[np.ndarray]:
    """One sample as arrays in model-input order, checked against the inputs' signatures."""
    names = [t.name for t in inputs]
    if isinstance(sample, dict):
        by_name = {_short(k, names): v for k, v in sample.items()}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise DatasetError(f"representative dataset, sample {index}: no value for input(s) {missing} "
                               f"(got {sorted(sample)})")
        values = [by_name[n] for n in names]
    else:
        values = list(sample) if isinstance(sample, (list, tuple)) else [sample]
        if len(values) != len(inputs):
            raise DatasetError(f"representative dataset, sample {index}: {len(values)} arrays for "
                               f"{len(inputs)} model inputs {names}")
    out = []
    for t, v in zip(inputs, values):
        arr = np.asarray(v)
        want = t.signature
        if arr.ndim != len(want) or any(w >= 0 and w != d for w, d in zip(want, arr.shape)):
            raise DatasetError(f"representative dataset, sample {index}, input {t.name!r}: shape "
                               f"{list(arr.shape)} does not fit the model's {list(want)}")
        if arr.dtype != t.dtype.numpy:
            if not (arr.dtype.kind == "f" and t.dtype in (DType.FLOAT32, DType.FLOAT16)) and \
                    not np.can_cast(arr.dtype, t.dtype.numpy, "same_kind"):
                raise DatasetError(f"representative dataset, sample {index}, input {t.name!r}: dtype "
                                   f"{arr.dtype} where the model takes {np.dtype(t.dtype.numpy)}")
            arr = arr.astype(t.dtype.numpy)
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise DatasetError(f"representative dataset, sample {index}, input {t.name!r}: holds NaN or "
                               "Inf; calibration needs finite values")
        out.append(arr)
    return out


def _short(key: str, names: list[str]) -> str:
    """Match a signature-style input name ("x") to a tensor name ("serving_default_x:0")."""
    if key in names:
        return key
    hits = [n for n in names if n.split(":")[0].endswith("_" + key) or n.split(":")[0] == key]
    return hits[0] if len(hits) == 1 else key


#: Called after each sample with a function giving any tensor's value (e.g. to record
#: what happens inside a fused op).
Observer = Callable[[Callable[[Tensor], np.ndarray]], None]


def calibrate(model: Model, dataset: Any, *, progress: bool = True, max_samples: int | None = None,
              observers: Iterable[Observer] = ()) -> dict[int, Range]:
    """Ranges of the main subgraph's float tensors, keyed by ``id(tensor)`` of ``model``."""
    interp = Interpreter(model_content=model, experimental_preserve_all_tensors=True)
    sg = model.main
    inputs = list(sg.inputs)
    tracked = [(i, t) for i, t in enumerate(sg.tensors)
               if t.dtype == DType.FLOAT32 and not t.is_constant]
    ranges = {id(t): Range(np.inf, -np.inf) for _, t in tracked}
    positions_of = {id(t): i for i, t in enumerate(sg.tensors)}
    observers = list(observers)
    iterator = samples(dataset)
    if progress:
        try:
            from tqdm.auto import tqdm

            from .datasets import sample_count  # datasets imports DatasetError from here

            total = sample_count(dataset)  # None: a generator's length is unknown, no ETA then
            if total is not None and max_samples is not None:
                total = min(total, max_samples)
            iterator = tqdm(iterator, desc="calibrating", unit="sample", total=total, leave=True)
        except ImportError:  # tqdm is optional: no progress bar
            pass
    count = 0
    shapes: list[tuple] | None = None
    for index, sample in enumerate(iterator):
        if max_samples is not None and index >= max_samples:
            break
        feeds = _feeds(sample, inputs, index)
        new_shapes = [a.shape for a in feeds]
        if new_shapes != shapes:
            positions = {id(t): k for k, t in enumerate(sg.tensors)}
            for t, arr in zip(inputs, feeds):
                interp.resize_tensor_input(positions[id(t)], arr.shape)
            interp.allocate_tensors()
            shapes = new_shapes
        interp.reset_all_variables()
        for d, arr in zip(interp.get_input_details(), feeds):
            interp.set_tensor(d["index"], arr)
        interp.invoke()
        for i, t in tracked:
            ranges[id(t)].update(interp.get_tensor(i))
        for observe in observers:
            observe(lambda t: interp.get_tensor(positions_of[id(t)]))
        count += 1
    if count == 0:
        raise DatasetError("representative dataset: no samples")
    return {k: r for k, r in ranges.items() if r.min <= r.max}
