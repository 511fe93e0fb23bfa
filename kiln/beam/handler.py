"""`KilnModelHandler`: Apache Beam's RunInference over a .tflite model, on any Beam runner."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from kiln.errors import KilnError, ModelError, UnsupportedError
from kiln.format import read_model

from .model import BACKENDS, KilnModel, Signature, model_spec

#: Largest batch the handler proposes for a model whose batch dimension is free.
DEFAULT_MAX_BATCH = 256
#: Input bytes one proposed batch may hold (a model with large rows gets smaller batches).
BATCH_INPUT_BYTES = 32 << 20


def read_model_bytes(model_uri: str) -> bytes:
    """The file at ``model_uri`` through Beam's file systems (local paths, gs://, s3://, ...)."""
    try:
        with FileSystems.open(model_uri) as f:
            return f.read()
    except Exception as e:  # Beam wraps file-system errors in its own BeamIOError
        raise ModelError(f"KilnModelHandler: cannot read the model {model_uri!r}: {e}") from None


def _located(error: KilnError, where: str) -> KilnError:
    """``error`` again, its message prefixed with ``where`` (the handler and its model)."""
    try:
        return type(error)(f"{where}: {error}")
    except TypeError:  # an error class with a constructor of its own
        return KilnError(f"{where}: {type(error).__name__}: {error}")


class KilnModelHandler(ModelHandler[Any, PredictionResult, KilnModel]):
    """Runs a .tflite model in RunInference: numpy examples in, a dict of outputs per example out.

    Args:
      model_uri: the .tflite file; any path Beam's FileSystems reads (gs://... on Dataflow).
      signature_key: the signature to run (default: the only one, or serving_default).
      backend: "kiln" (default, kiln's NumPy runtime), "litert" (ai-edge-litert) or "xla"
        (kiln's runtime with `kiln.xla.XlaDelegate`; needs jax).
      num_threads: passed to the interpreter.
      min_batch_size / max_batch_size / max_batch_duration_secs / max_batch_weight /
        element_size_fn: override the batching derived from the model (see
        `batch_elements_kwargs`).
      large_model / model_copies: share the loaded model across a worker's processes
        (Beam's multi_process_shared) instead of one copy per process.

    An example is a numpy array (one row, without the batch dimension, for a single-input
    model) or a dict input name -> array; wrap the handler in Beam's ``KeyedModelHandler`` for
    ``(key, example)`` pairs. Each result is ``PredictionResult(example, {output name: row})``.
    """

    def __init__(self, model_uri: str, *, signature_key: str | None = None, backend: str = "kiln",
                 num_threads: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if backend not in BACKENDS:
            raise UnsupportedError(f"KilnModelHandler: backend {backend!r} is not one of {list(BACKENDS)}")
        if backend == "xla":
            from kiln.xla import require_jax

            require_jax()  # fail while the pipeline is built, not on the workers
        self._model_uri = model_uri
        self._signature_key = signature_key
        self._backend = backend
        self._num_threads = num_threads
        self._spec: Signature | None = None

    # -- the model -----------------------------------------------------------------------------
    def _read(self) -> bytes:
        return read_model_bytes(self._model_uri)

    def _where(self) -> str:
        return f"KilnModelHandler({self._model_uri})"

    def spec(self) -> Signature:
        """The signature's inputs, outputs and batch dimension (read once, on first use)."""
        if self._spec is None:
            try:
                self._spec = model_spec(read_model(self._read()), self._signature_key)
            except KilnError as e:
                raise _located(e, self._where()) from None
        return self._spec

    def load_model(self) -> KilnModel:
        """Called once per worker process (or once per machine with large_model/model_copies)."""
        try:
            model = KilnModel(self._read(), self._signature_key, self._backend, self._num_threads,
                              self._xla_buckets())
        except KilnError as e:
            raise _located(e, self._where()) from None
        self._spec = model.spec
        return model

    def _xla_buckets(self) -> list[int] | None:
        """On the xla backend, the batch sizes KilnModel feeds (powers of two) for the smallest and
        largest batch Beam makes: the delegate compiles them at load and pads other batches up."""
        if self._backend != "xla" or not self.spec().batched or self.spec().fixed_batch is not None:
            return None
        kwargs = self.batch_elements_kwargs()
        return sorted({1 << (int(kwargs[k]) - 1).bit_length() for k in ("min_batch_size", "max_batch_size")})

    def update_model_path(self, model_path: str | None = None):
        """Beam's model refresh: the next load_model reads ``model_path``."""
        if model_path:
            self._model_uri = model_path
            self._spec = None

    # -- inference -----------------------------------------------------------------------------
    def validate_inference_args(self, inference_args: dict[str, Any] | None):
        if inference_args:
            raise UnsupportedError(f"{self._where()}: inference_args {sorted(inference_args)} are not "
                                   "supported; a .tflite signature takes its inputs only")

    def run_inference(self, batch: Sequence[Any], model: KilnModel,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        self.validate_inference_args(inference_args)
        try:
            rows = model.predict(list(batch))
        except KilnError as e:
            raise _located(e, self._where()) from None
        return [PredictionResult(example, row, model_id=self._model_uri) for example, row in zip(batch, rows)]

    # -- what Beam asks the handler ------------------------------------------------------------
    def batch_elements_kwargs(self) -> Mapping[str, Any]:
        """BatchElements' arguments: from the model's batch dimension, then the user's overrides.

        A static batch B gives batches of exactly B (so max 1 for a model converted with batch
        1); a free batch gives 1 .. min(256, what fits in 32 MiB of input rows), on the xla
        backend full batches of that size (each new size compiles); a model without a shared
        leading dimension runs one example per call.
        """
        spec = self.spec()
        if not spec.batched:
            derived = {"min_batch_size": 1, "max_batch_size": 1}
        elif spec.fixed_batch is not None:
            derived = {"min_batch_size": spec.fixed_batch, "max_batch_size": spec.fixed_batch}
        else:
            fits = int(max(1, min(DEFAULT_MAX_BATCH, BATCH_INPUT_BYTES // max(spec.row_bytes(), 1))))
            # XLA compiles each batch size: full batches keep it to one (and a bucket for a remainder)
            derived = {"min_batch_size": fits if self._backend == "xla" else 1, "max_batch_size": fits}
        user = self._batching_kwargs
        derived.update(user)
        if derived["min_batch_size"] > derived["max_batch_size"]:  # one bound overridden: it wins
            if "max_batch_size" in user and "min_batch_size" in user:
                raise UnsupportedError(f"{self._where()}: min_batch_size {user['min_batch_size']} > "
                                       f"max_batch_size {user['max_batch_size']}")
            bound = "max_batch_size" if "max_batch_size" in user else "min_batch_size"
            derived["min_batch_size" if bound == "max_batch_size" else "max_batch_size"] = derived[bound]
        return derived

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        """Bytes of the examples' arrays (what RunInference reports as its input size)."""
        total = 0
        for example in batch:
            values = example.values() if isinstance(example, Mapping) else (example,)
            total += sum(np.asarray(v).nbytes for v in values)
        return total

    def get_metrics_namespace(self) -> str:
        return "BeamML_Kiln"
