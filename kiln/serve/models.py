"""The served models: versions found on disk, loaded, swapped in and retired (TF Serving's manager).

Each model's base path holds numeric version directories; its version policy (newest by
default) says which are served. A poller thread re-reads the directories every
``file_system_poll_wait_seconds``: a new version is loaded and made available before an old
one is retired, and a retired version finishes the requests it already holds before its
executor closes, so a swap drops nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .backends import LoadError, ServedModel, find_model_file, load, signature_def_json
from .batching import BatchScheduler, CollectingRunner, DirectExecutor, Hooks, InlineExecutor
from .config import BatchingOptions, ConfigError, ModelSpec, read_batching_parameters
from .metrics import Metrics
from .status import InvalidArgument, NotFound, Unavailable

log = logging.getLogger("kiln.serve")

#: A version's own batching parameters (TF Serving's --enable_per_model_batching_parameters).
PER_MODEL_BATCHING_FILE = "batching_params.pbtxt"
#: Threads that call a TF function holding BatchFunction: enough concurrent calls for it to batch.
IN_GRAPH_BATCHING_THREADS = 64
#: An unbatched .tflite model whose one-row call takes less than this runs on the request's own
#: thread: handing it to a worker thread would cost more than the call.
INLINE_CALL_SECONDS = 0.0005


@dataclass
class ServedVersion:
    """One loaded version with its executor; ``users`` counts requests holding it, ``retiring`` says
    that the manager waits for the last of them. ``predict_labels``: the metric labels of its predict
    requests, made once; ``plans``: what a front end prepared once for this version (by its own key)."""

    model: str
    version: int
    loaded: ServedModel
    executor: object
    batching: bool
    users: int = 0
    retiring: bool = False
    row_work: int = 0  # bytes of the model's tensors per row of a call (`_row_work`)
    predict_labels: tuple = field(init=False, repr=False)
    plans: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self):
        self.predict_labels = (self.model, str(self.version), "predict")


@dataclass
class _Model:
    spec: ModelSpec
    served: dict = field(default_factory=dict)   # version -> ServedVersion
    states: dict = field(default_factory=dict)   # version -> (state, error_code, error_message)
    failed: dict = field(default_factory=dict)   # version -> mtime of the file that failed to load


def versions_on_disk(base: Path) -> dict[int, Path]:
    try:
        entries = list(base.iterdir())
    except OSError:
        return {}
    return {int(p.name): p for p in entries if p.name.isdigit() and p.is_dir()}


class ModelManager:
    """Loads, serves and retires model versions; answers status and metadata."""

    def __init__(self, specs: list[ModelSpec], backend: str = "kiln", batching: BatchingOptions | None = None,
                 num_threads: int | None = None, workers: int | None = None, metrics: Metrics | None = None,
                 per_model_batching: bool = False, max_queued: int = 256, inline: bool = True):
        """``per_model_batching``: TF Serving's --enable_per_model_batching_parameters (see `_batching_for`);
        ``max_queued``: requests an unbatched version queues before it answers 503; ``inline``: run
        cheap unbatched models on the request's thread (see `INLINE_CALL_SECONDS`)."""
        self.backend = backend
        self.max_queued = max_queued
        self.inline = inline
        self.batching = batching
        self.per_model_batching = per_model_batching
        self.num_threads = num_threads
        self.workers = workers or os.cpu_count() or 1
        self.metrics = metrics or Metrics(s.name for s in specs)
        self._models = {s.name: _Model(s) for s in specs}
        self._mutex = threading.Lock()  # taken alone where no one waits (a C call, unlike the condition's)
        self._lock = threading.Condition(self._mutex)
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        for spec in specs:
            if not Path(spec.base_path).is_dir():
                raise ConfigError(f"model {spec.name!r}: base path {spec.base_path!r} is not a directory")

    # -- loading -------------------------------------------------------------------------------

    def poll_once(self) -> None:
        """Load the versions the policy wants and retire the others."""
        for model in list(self._models.values()):
            self._poll_model(model)

    def _poll_model(self, model: _Model) -> None:
        on_disk = versions_on_disk(Path(model.spec.base_path))
        for version in [v for v in model.failed if v not in on_disk]:  # a failed version deleted: forgotten
            del model.failed[version]
            with self._lock:
                model.states.pop(version, None)
        wanted = model.spec.policy.choose(list(on_disk))
        for version in sorted(set(wanted) - set(model.served), reverse=True):
            self._try_load(model, version, on_disk[version])
        available = [v for v in wanted if v in model.served]
        if wanted and not available:
            return  # keep what is served until a wanted version loads
        for version in sorted(set(model.served) - set(wanted)):
            self._retire(model, version)

    def _try_load(self, model: _Model, version: int, path: Path) -> None:
        name = model.spec.name
        try:
            kind, file = find_model_file(path)
        except LoadError:
            return  # still being written, or not a model: look again at the next poll
        mtime = file.stat().st_mtime_ns if file.exists() else 0
        if model.failed.get(version) == mtime:
            return
        with self._lock:
            model.states[version] = ("LOADING", "OK", "")
        try:
            options = self._batching_for(path)
            loaded = load(path, self.backend, self.num_threads, options.allowed_batch_sizes if options else None)
            executor, batching = self._executor(name, version, loaded, options)
        except Exception as exc:
            model.failed[version] = mtime
            message = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                model.states[version] = ("END", "UNKNOWN", message)
            log.error(f"model {name} version {version}: load failed: {message}")
            return
        served = ServedVersion(name, version, loaded, executor, batching, row_work=_row_work(loaded))
        self.metrics.attach(name, version)
        with self._lock:
            model.served[version] = served
            model.states[version] = ("AVAILABLE", "OK", "")
            model.failed.pop(version, None)
        how = "batched" if batching else ("TF in-graph BatchFunction" if loaded.has_batch_function else
                                          "unbatched, on the request's thread" if isinstance(executor, InlineExecutor)
                                          else "unbatched")
        log.info(f"model {name} version {version}: serving {loaded.path} with {loaded.backend} ({how})")

    def _batching_for(self, version_dir: Path) -> BatchingOptions | None:
        """The server's batching options, or with per-model batching the version's own
        ``batching_params.pbtxt`` (thread count from the server's; no file: not batched)."""
        if self.batching is None or not self.per_model_batching:
            return self.batching
        own = version_dir / PER_MODEL_BATCHING_FILE
        if not own.is_file():
            return None
        params = read_batching_parameters(own)
        return dataclasses.replace(params, num_batch_threads=self.batching.num_batch_threads)

    def _executor(self, name: str, version: int, loaded: ServedModel, batching: BatchingOptions | None):
        hooks = Hooks(self.metrics.observer(name, version), self.metrics.queue(name, version),
                      self.metrics.isolated(name, version))
        new_runner = loaded.new_runner
        if loaded.backend == "kiln" and loaded.kind == "tflite":  # (see CollectingRunner)
            new_runner = lambda: CollectingRunner(loaded.new_runner())  # noqa: E731
        label = f"{name}-{version}"
        if batching is not None and not loaded.has_batch_function:
            return BatchScheduler(batching, new_runner, None, label,
                                  _bucket_warmup(loaded, batching.allowed_batch_sizes), hooks), True
        if loaded.has_batch_function:
            if batching is not None:
                log.info(f"model {name} version {version}: its graph holds BatchFunction; not batched again")
            return DirectExecutor(new_runner, IN_GRAPH_BATCHING_THREADS, None, True, label,
                                  self.max_queued, hooks), False
        pool = DirectExecutor(new_runner, self.workers, None, loaded.thread_safe, label, self.max_queued, hooks)
        seconds = _call_seconds(loaded) if self.inline and loaded.kind == "tflite" else float("inf")
        if seconds < INLINE_CALL_SECONDS:  # requests of up to ~INLINE_CALL_SECONDS of work run inline
            return InlineExecutor(new_runner, label, hooks, max(1, int(INLINE_CALL_SECONDS / seconds)), pool), False
        return pool, False

    def _retire(self, model: _Model, version: int) -> None:
        with self._lock:
            served = model.served.pop(version)
            served.retiring = True
            model.states[version] = ("UNLOADING", "OK", "")
        threading.Thread(target=self._finish_retire, args=(model, served), daemon=True,
                         name=f"kiln-retire-{served.model}-{version}").start()

    def _finish_retire(self, model: _Model, served: ServedVersion) -> None:
        with self._lock:
            self._lock.wait_for(lambda: served.users == 0)
        served.executor.close(drain=True)
        self.metrics.detach(served.model, served.version)
        with self._lock:
            model.states[served.version] = ("END", "OK", "")
        log.info(f"model {served.model} version {served.version}: unloaded")

    def start_polling(self, interval: float) -> None:
        if interval <= 0:
            return

        def loop():
            while not self._stop.wait(interval):
                try:
                    self.poll_once()
                except Exception:  # a poll must never kill the poller
                    log.exception("file-system poll failed")

        self._poller = threading.Thread(target=loop, daemon=True, name="kiln-poll")
        self._poller.start()

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop polling and close every executor (running what is queued when ``drain``, for up to
        ``timeout`` s in all; what is left then is answered 503)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        deadline = None if timeout is None else time.monotonic() + timeout
        for model in self._models.values():
            with self._lock:
                served, model.served = list(model.served.values()), {}
            for s in served:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                s.executor.close(drain=drain, timeout=left)
                self.metrics.detach(s.model, s.version)

    # -- lookup --------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return all(m.served for m in self._models.values())

    def not_served(self) -> dict[str, str]:
        """Models without an available version, each with the reason (the last load error, if any)."""
        out = {}
        with self._lock:
            for name, model in self._models.items():
                if not model.served:
                    errors = [msg for _, (state, _, msg) in sorted(model.states.items()) if msg]
                    out[name] = errors[-1] if errors else f"no version found under {model.spec.base_path}"
        return out

    def model_names(self) -> list[str]:
        return sorted(self._models)

    def _model(self, name: str) -> _Model:
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"Servable not found for request: Latest({name})")
        return model

    def _resolve(self, name: str, version: int | None, label: str | None) -> int | None:
        if version is not None and label is not None:
            raise InvalidArgument(f"Both model version ({version}) and model version label ({label}) "
                                  f"cannot be supplied.")
        if label is None:
            return version
        model = self._model(name)
        if label not in model.spec.labels:
            raise InvalidArgument(f"Unrecognized servable version label: {label}")
        return int(model.spec.labels[label])

    def acquire(self, name: str, version: int | None = None, label: str | None = None) -> ServedVersion:
        """The version a request runs on (newest by default); release it with `release`."""
        if label is not None:
            version = self._resolve(name, version, label)
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"Servable not found for request: Latest({name})")
        if self._stop.is_set():  # closing: its versions are being retired, none is missing
            raise Unavailable("the server is shutting down; the request was not accepted")
        with self._mutex:
            if version is None:
                if not model.served:
                    raise NotFound(f"Servable not found for request: Latest({name})")
                served = model.served[max(model.served)]
            else:
                served = model.served.get(version)
                if served is None:
                    raise NotFound(f"Servable not found for request: Specific({name}, {version})")
            served.users += 1
            return served

    def release(self, served: ServedVersion) -> None:
        with self._mutex:
            served.users -= 1
            if not served.users and served.retiring:  # a retiring version waits for its last user
                self._lock.notify_all()

    def status(self, name: str, version: int | None = None, label: str | None = None) -> dict:
        """GetModelStatusResponse as TF Serving prints it."""
        version = self._resolve(name, version, label)
        model = self._models.get(name)
        with self._lock:
            states = dict(model.states) if model else {}
        if version is not None:
            if version not in states:
                raise NotFound(f"Could not find version {version} of model {name}")
            states = {version: states[version]}
        if not states:
            raise NotFound(f"Could not find any versions of model {name}")
        return {"model_version_status": [
            {"version": str(v), "state": s, "status": {"error_code": code, "error_message": message}}
            for v, (s, code, message) in sorted(states.items(), reverse=True)]}

    def metadata(self, name: str, version: int | None = None, label: str | None = None) -> dict:
        """GetModelMetadataResponse (signature_def) as TF Serving prints it."""
        served = self.acquire(name, version, label)
        try:
            loaded = served.loaded
            sig_json = signature_def_json(loaded)
            return {"model_spec": {"name": name, "signature_name": "", "version": str(served.version)},
                    "metadata": {"signature_def": sig_json}}
        finally:
            self.release(served)


def _row_work(loaded: ServedModel) -> int:
    """Bytes a call holds per row of its batch at its peak, which a large request claims in the
    worker's memory budget before it runs: the tensors whose first dimension is the batch, alive
    from the node that writes them to the last node that reads them (the runtimes free an
    intermediate after its last reader; inputs and outputs live throughout). 0 when the model
    does not say (a SavedModel)."""
    if loaded.make_interpreter is None:
        return 0
    try:
        interpreter = loaded.make_interpreter()
        details = interpreter.get_tensor_details()
        nodes = interpreter._get_ops_details()  # noqa: SLF001 - tf.lite's and kiln's node list
    except Exception:  # noqa: BLE001 - no estimate: such calls are counted by their tensors only
        return 0
    per_row = {}
    for tensor in details:
        shape = list(tensor.get("shape_signature", ()))
        if shape and shape[0] == -1:
            size = np.dtype(tensor["dtype"]).itemsize
            for d in shape[1:]:
                size *= max(int(d), 1)
            per_row[tensor["index"]] = size
    last_read = {}
    for position, node in enumerate(nodes):
        for i in node.get("inputs", ()):
            last_read[int(i)] = position
    ends = {i for i in (*(d["index"] for d in interpreter.get_input_details()),
                        *(d["index"] for d in interpreter.get_output_details()))}
    live = sum(per_row.get(i, 0) for i in ends)
    peak = live
    for position, node in enumerate(nodes):
        written = [int(i) for i in node.get("outputs", ()) if int(i) in per_row and int(i) not in ends]
        live += sum(per_row[i] for i in written)
        peak = max(peak, live)
        for i in {*written, *(int(i) for i in node.get("inputs", ()))}:
            if i in per_row and i not in ends and last_read.get(i, position) <= position:
                live -= per_row[i]
    return peak


def _call_seconds(loaded: ServedModel) -> float:
    """The fastest of a few one-row calls of the default signature (inf when it cannot be timed)."""
    try:
        signature = loaded.signature()
        feeds = signature.zeros(1) if signature.batched else None
        if feeds is None:
            return float("inf")
        runner = loaded.new_runner()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            runner(signature.key, feeds)
            best = min(best, time.perf_counter() - start)
        return best
    except Exception:  # a model that cannot run zeros is timed by its requests instead
        return float("inf")


def _bucket_warmup(loaded: ServedModel, sizes):
    """Run every allowed batch size once per worker (XLA compiles, interpreters allocate) before serving."""
    if not sizes:
        return None

    def warm(runner) -> None:
        for key in loaded.signatures:
            for rows in sizes:
                feeds = loaded.signatures[key].zeros(rows)
                if feeds is not None:
                    runner(key, feeds)

    return warm

