"""A loaded .tflite model that answers a batch of examples with one output dict per example.

This is the Beam-free half of `KilnModelHandler`: it reads what the model's signature expects
(names, dtypes, which dimension is the batch), checks every example against it, stacks examples
into batches the model accepts and splits the outputs back into rows. Keeping it free of Beam
lets it be driven row by row, and keeps every call one method (`KilnModel.predict`), which is
what Beam's cross-process model sharing can proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from kiln.errors import InterpreterError, OpError, UnsupportedError
from kiln.runtime import served
from kiln.runtime.served import Signature, TensorSpec, model_signatures, pick_signature

BACKENDS = ("kiln", "litert", "xla")


def model_spec(model, signature_key: str | None = None) -> Signature:
    """The signature ``signature_key`` of a kiln IR model (default: serving_default or the only one)."""
    return _with_inputs(pick_signature(model_signatures(model), signature_key))


def _with_inputs(signature: Signature) -> Signature:
    if not signature.inputs:
        raise UnsupportedError(f"signature {signature.key!r} has no inputs; there is nothing to feed examples to")
    return signature


def _where(index: int, name: str) -> str:
    return f"batch element {index}, input {name!r}"


def check_value(spec: TensorSpec, row_shape: tuple[int, ...], value, where: str) -> np.ndarray:
    """``value`` as an array of the input's dtype and ``row_shape``, or an InterpreterError at ``where``.

    NumPy values are converted only where nothing can be lost (int16 -> float32, not float64 ->
    float32): a wrong dtype usually means a wrong preprocessing step. Python lists and numbers
    have no dtype of their own and take the input's (as ``tf.constant(value, dtype)`` does),
    except floats for an integer input and integers out of its range.
    """
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged nested lists, unconvertible objects
        raise InterpreterError(f"{where}: cannot read it as an array: {e}") from None
    if spec.is_string:
        if arr.dtype.kind not in "SUO":
            raise InterpreterError(f"{where}: expected strings or bytes, got {arr.dtype}")
        arr = arr.astype(object)
    elif arr.dtype != spec.dtype:
        python = not isinstance(value, (np.ndarray, np.generic)) and arr.dtype.kind in "biuf"
        if not (np.can_cast(arr.dtype, spec.dtype, casting="safe")
                or python and np.can_cast(arr.dtype, spec.dtype, casting="same_kind")):
            raise InterpreterError(f"{where}: expected dtype {spec.dtype}, got {arr.dtype} (NumPy values are "
                                   "converted only where no precision can be lost)")
        converted = arr.astype(spec.dtype)
        if spec.dtype.kind in "iu" and not np.array_equal(converted, arr):
            raise InterpreterError(f"{where}: values out of the range of {spec.dtype}")
        arr = converted
    if arr.ndim != len(row_shape) or any(w != -1 and g != w for g, w in zip(arr.shape, row_shape)):
        wanted = tuple(None if d == -1 else d for d in row_shape)
        raise InterpreterError(f"{where}: expected shape {wanted} (None: any size), got {arr.shape}")
    return arr


class KilnModel:
    """A .tflite model on one backend, answering lists of examples (see `predict`).

    Args:
      content: the .tflite bytes.
      signature_key: the signature to run (default: the only one, or serving_default).
      backend: "kiln" (kiln's NumPy runtime), "litert" (ai-edge-litert's interpreter) or
        "xla" (kiln's runtime with every lowerable node on `kiln.xla.XlaDelegate`).
      num_threads: passed to the interpreter.

    An interpreter holds one set of tensors, so calls are serialised with a lock: Beam shares
    one loaded model between the threads of a worker process. ``invocations`` counts the
    interpreter calls made so far.
    """

    def __init__(self, content: bytes, signature_key: str | None = None, backend: str = "kiln",
                 num_threads: int | None = None, batch_sizes=None):
        if backend not in BACKENDS:
            raise UnsupportedError(f"backend {backend!r} is not one of {list(BACKENDS)}")
        self._model = served.open(content, backend, num_threads=num_threads, batch_sizes=batch_sizes)
        self.spec = _with_inputs(self._model.signature(signature_key))
        self.backend = backend
        self._runner = self._model.new_runner()
        self._lock = threading.Lock()
        self.invocations = 0

    # -- examples -> columns -------------------------------------------------------------------
    def _columns(self, index: int, example) -> dict[str, np.ndarray]:
        specs = list(self.spec.inputs.values())
        names = [s.name for s in specs]
        if isinstance(example, Mapping):
            unknown = [k for k in example if k not in names]
            missing = [n for n in names if n not in example]
            if unknown or missing:
                raise InterpreterError(
                    f"batch element {index}: the model's inputs are {names}; "
                    + (f"unknown {unknown}" if unknown else "") + ("; " if unknown and missing else "")
                    + (f"missing {missing}" if missing else ""))
            values = example
        elif len(specs) == 1:
            values = {names[0]: example}
        else:
            raise InterpreterError(f"batch element {index}: the model has {len(specs)} inputs {names}; pass a "
                                   f"dict of input name -> array, not {type(example).__name__}")
        return {s.name: check_value(s, self.spec.row_shape(s), values[s.name], _where(index, s.name))
                for s in specs}

    # -- running -------------------------------------------------------------------------------
    def _invoke(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.invocations += 1
        return self._runner.run(self.spec.key, feeds)

    def _batch_sizes(self, n: int) -> list[tuple[int, int]]:
        """(rows taken, rows fed) per call for ``n`` rows of one shape."""
        fixed = self.spec.fixed_batch
        if fixed is not None:
            return [(min(fixed, n - start), fixed) for start in range(0, n, fixed)]
        if self.backend == "xla":  # each new batch size compiles anew: feed powers of two
            return [(n, 1 << (n - 1).bit_length())]
        return [(n, n)]

    def _run_rows(self, rows: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        out: list[dict[str, np.ndarray]] = []
        start = 0
        for taken, fed in self._batch_sizes(len(rows)):
            chunk = rows[start:start + taken]
            start += taken
            padding = [chunk[0]] * (fed - taken)  # rows copied from the first, dropped after
            feeds = {name: np.stack([r[name] for r in chunk + padding]) for name in self.spec.inputs}
            results = self._invoke(feeds)
            per_row = {}
            for name, value in results.items():
                per_row[name] = value.ndim > 0 and value.shape[0] == fed
                if not per_row[name] and fed > 1:
                    raise OpError(f"output {name!r} has shape {value.shape}: its first dimension is not the "
                                  f"batch of {fed} rows, so it cannot be split per example; run this model "
                                  "with max_batch_size=1 (each example then gets the whole output)")
            out += [{name: np.array(value[i] if per_row[name] else value) for name, value in results.items()}
                    for i in range(taken)]
        return out

    def predict(self, examples: Sequence) -> list[dict[str, np.ndarray]]:
        """One dict output name -> array per example, in order.

        An example is an array (single-input models) or a dict input name -> array. For a
        batched model it is one row (no batch dimension); examples whose free dimensions differ
        run in separate calls.
        """
        columns = [self._columns(i, ex) for i, ex in enumerate(examples)]
        with self._lock:
            if not self.spec.batched:
                return [{k: np.array(v) for k, v in self._invoke(c).items()} for c in columns]
            groups: dict[tuple, list[int]] = {}
            for i, c in enumerate(columns):
                groups.setdefault(tuple(c[name].shape for name in self.spec.inputs), []).append(i)
            results: list = [None] * len(columns)
            for indices in groups.values():
                for i, row in zip(indices, self._run_rows([columns[i] for i in indices])):
                    results[i] = row
            return results


