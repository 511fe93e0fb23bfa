"""Batching must not change results: checked at conversion, not discovered by users.

BatchFunction concatenates concurrent requests along dimension 0, pads the batch with copies of
its first row up to an allowed size, runs the function once and splits every output by rows. That
is only right for a function whose outputs are batch-major (dimension 0 of each output is the sum
of the inputs' dimension 0) and whose rows do not interact (no batch statistic, no state that
sees batches instead of requests). Two checks:

* static, always: the function's graph is shape-inferred at a concrete batch size (the saved
  ``_output_shapes`` removed, so TensorFlow recomputes them); an output of rank 0 or whose
  dimension 0 is not that batch size is refused (the original requires this and TensorFlow fails
  every request of more than one row at serving);
* measured, by the accuracy guard: the converted model is loaded with every BatchFunction set to
  hold the requests of one measurement together (one allowed size, a long timeout), the measurement
  inputs are sent as concurrent requests plus a filler request of other rows that completes the
  batch, and each answer is compared with the model before batching. A difference beyond ``TOLERANCE`` (a function
  mixing rows or keeping state) is refused with the measured error.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from . import evaluate
from .rewrite import BatchingError
from .savedmodel import DT_RESOURCE, arg_shape

#: batched vs unbatched beyond this (relative to the output's magnitude) means rows interact
TOLERANCE = 1e-2
#: the concrete batch size of the static check (not 1: a broadcast would pass)
PROBE_ROWS = 3
#: how long the probe's batch waits for all its requests (a filler request completes it sooner)
PROBE_TIMEOUT_MICROS = 2_000_000


def _stripped(fdef):
    """A copy without the saved ``_output_shapes`` (they were recorded with a dynamic batch)."""
    from tensorflow.core.framework import function_pb2

    copy = function_pb2.FunctionDef()
    copy.CopyFrom(fdef)
    for node in copy.node_def:
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
    for index in list(copy.arg_attr):
        if "_output_shapes" in copy.arg_attr[index].attr:
            del copy.arg_attr[index].attr["_output_shapes"]
    return copy


def output_rows(runner, name: str, batched: list[int], rows: int = PROBE_ROWS) -> list:
    """Each output's static shape (list, None dims unknown; None if unknown rank) for ``rows`` input rows."""
    import tensorflow as tf
    from tensorflow.python.framework import function_def_to_graph

    fdef = runner.model.functions[name]
    shapes = []
    for i, arg in enumerate(fdef.signature.input_arg):
        shape = arg_shape(fdef, i)
        if arg.type == DT_RESOURCE or shape is None:
            shapes.append(None)
        elif i in batched:
            shapes.append(tf.TensorShape([rows] + shape[1:]))
        else:
            shapes.append(tf.TensorShape(shape))
    try:
        graph = function_def_to_graph.function_def_to_graph(_stripped(runner.renamed[name]), input_shapes=shapes)
    except Exception:  # noqa: BLE001 (a function TensorFlow cannot rebuild alone: left to the measurement)
        return [None] * len(fdef.signature.output_arg)
    return [None if o.shape.rank is None else o.shape.as_list() for o in graph.outputs]


def _traced_as(name: str) -> str:
    """``__inference_body_11`` -> ``body``: the Python function a concrete function traced."""
    return re.sub(r"_\d+$", "", name.removeprefix("__inference_"))


def output_labels(model, name: str) -> list[str]:
    """Each output of function ``name`` as its author wrote it — the key in the structure it returns
    (``output 'total' (tensor 'identity_1')``) — or by position where it returns a bare tensor. The
    structure is the saved one of ``name``, or of another trace of the same Python function (a
    function called inside a signature is saved as a graph function only)."""
    from tensorflow.python.saved_model import nested_structure_coder
    from tensorflow.python.util import nest

    tensors = [a.name for a in model.functions[name].signature.output_arg]
    saved = model.meta.object_graph_def.concrete_functions
    found = set()
    for other in [name] + sorted(n for n in saved if n != name and _traced_as(n) == _traced_as(name)):
        if other in saved and saved[other].HasField("output_signature"):
            try:
                keys = tuple(path for path, _ in nest.flatten_with_joined_string_paths(
                    nested_structure_coder.decode_proto(saved[other].output_signature)))
            except Exception:  # noqa: BLE001 (a structure this TensorFlow cannot rebuild)
                continue
            if len(keys) == len(tensors):
                found.add(keys)
    keys = found.pop() if len(found) == 1 else ("",) * len(tensors)   # traces that disagree: by position
    return [f"output {key!r} (tensor {tensor!r})" if key else f"output {k} ({tensor!r})"
            for k, (key, tensor) in enumerate(zip(keys, tensors))]


def check_batch_major(runner, name: str, batched: list[int], where: str) -> list[str]:
    """Refuse outputs that are not batch-major; notes for outputs whose dimension 0 stays unknown."""
    labels = output_labels(runner.model, name)
    notes = []
    for k, shape in enumerate(output_rows(runner, name, batched)):
        label = labels[k]
        if shape is not None and len(shape) == 0:
            raise BatchingError(f"{where}: cannot batch function {name!r}: {label} is a scalar; Batched output "
                                f"tensor has 0 dimensions. BatchFunction splits every output by rows, so each "
                                f"output's dimension 0 must be the batch")
        if shape is not None and shape[0] is not None and shape[0] != PROBE_ROWS:
            raise BatchingError(
                f"{where}: cannot batch function {name!r}: {label} has shape {shape} for {PROBE_ROWS} input rows; "
                f"BatchFunction splits its outputs by rows, so every output's dimension 0 must equal the sum of "
                f"the inputs' dimension 0 (TensorFlow would fail every request of more than one row: Batched output "
                f"tensor's 0th dimension does not equal the sum of the 0th dimension sizes of the input tensors). "
                f"Batch a function whose outputs are per row")
        if shape is None or shape[0] is None:
            notes.append(f"{name}: dimension 0 of {label} is not known before running; the accuracy check measures "
                         f"it")
    return notes


def probe_snapshot(model, directory, size: int) -> str:
    """A snapshot whose BatchFunctions hold ``size`` rows of concurrent requests in one batch."""
    path = evaluate.snapshot(model, directory)
    proto_path = Path(path) / "saved_model.pb"
    proto = type(model.proto)()
    proto.ParseFromString(proto_path.read_bytes())
    for meta in proto.meta_graphs:
        nodes = list(meta.graph_def.node) + [n for f in meta.graph_def.library.function for n in f.node_def]
        for node in nodes:
            if node.op == "BatchFunction":
                node.attr["max_batch_size"].i = size
                node.attr["allowed_batch_sizes"].list.Clear()
                node.attr["allowed_batch_sizes"].list.i.append(size)
                node.attr["batch_timeout_micros"].i = PROBE_TIMEOUT_MICROS
                node.attr["max_enqueued_batches"].i = 1000
                node.attr["num_batch_threads"].i = 1
    proto_path.write_bytes(proto.SerializeToString())
    return path


def _shape_key(sample: dict) -> tuple:
    return tuple(sorted((k, np.shape(v)[1:], np.asarray(v).dtype.str) for k, v in sample.items()))


def _filler(sample: dict, rows: int) -> dict:
    """``rows`` rows repeating the sample's first row: another request in the same batch."""
    return {k: np.repeat(np.asarray(v)[:1], rows, axis=0) for k, v in sample.items()}


def run_concurrently(model_dir: str, inputs: dict, size: int | None = None) -> dict:
    """signature -> outputs per sample, every sample of a signature sent at once from its own thread
    (samples of different non-batch shapes in separate rounds: the batch op cannot concatenate them).
    ``size``: the probe batch size; a filler request completes each round to it, so the batch runs at
    once instead of at the timeout."""
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    out = {}
    for key, samples in inputs.items():
        fn = loaded.signatures[key]
        results: list = [None] * len(samples)
        groups: dict = {}
        for i, sample in enumerate(samples):
            groups.setdefault(_shape_key(sample), []).append(i)
        errors = []
        for members in groups.values():
            round_samples = {i: samples[i] for i in members}
            rows = sum(_rows(samples[i]) for i in members)
            if size is not None and size > rows and all(np.ndim(v) for v in samples[members[0]].values()):
                round_samples[-1] = _filler(samples[members[0]], size - rows)
            barrier = threading.Barrier(len(round_samples))
            threads = [threading.Thread(target=_request, args=(fn, sample, barrier, results, errors, i))
                       for i, sample in round_samples.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        out[key] = errors[0] if errors else results
    return out


def _rows(sample: dict) -> int:
    first = np.asarray(next(iter(sample.values()))) if sample else np.zeros(())
    return int(first.shape[0]) if first.ndim else 1


def _request(fn, sample: dict, barrier, results: list, errors: list, index: int) -> None:
    """One client: wait for the others, call the signature; the filler (index -1) keeps no result."""
    import tensorflow as tf

    specs = fn.structured_input_signature[1]
    feeds = {n: tf.constant(np.asarray(sample[n]), dtype=spec.dtype) for n, spec in specs.items() if n in sample}
    barrier.wait()
    try:
        result = {k: v.numpy() for k, v in fn(**feeds).items()}
    except Exception as exc:  # noqa: BLE001 (reported as the stage's failure)
        errors.append(exc)
        return
    if index >= 0:
        results[index] = result


def rows_of(samples_by_key: dict) -> int:
    """The most rows one round of concurrent requests holds (what the probe batch must take)."""
    most = 1
    for samples in samples_by_key.values():
        groups: dict = {}
        for sample in samples:
            first = np.asarray(next(iter(sample.values())))
            groups[_shape_key(sample)] = groups.get(_shape_key(sample), 0) + (first.shape[0] if first.ndim else 1)
        most = max([most] + list(groups.values()))
    return most


def refuse_changed(measured: dict, stateful: dict) -> list[str]:
    """StageError when batching changed an output beyond TOLERANCE; notes on state that sees batches."""
    for key, m in sorted(measured.items()):
        for name, e in sorted(m.get("outputs", {}).items()):
            if e.get("max_rel", 0) > TOLERANCE or e.get("exact") is False:
                why = ("keeps state (" + "; ".join(stateful[key]) + ")") if key in stateful else \
                    "mixes rows (e.g. a batch statistic), so padding rows and other requests change each answer"
                raise evaluate.StageError(
                    f"batching: concurrent requests merged and padded as BatchFunction does change output {name!r} "
                    f"of signature {key!r} (max relative error {e.get('max_rel', 0):.3g}, max abs error "
                    f"{e.get('max_abs', 0):.3g}): the batched function {why}. Remove its batch_options, or batch a "
                    f"function whose rows are independent" + ("" if key in stateful else evaluate.on_generated(m)))
    return [f"{key}: the batched function keeps state ({'; '.join(effects)}): it runs once per batch, not once per "
            f"request, and padding rows reach it; outputs measured unchanged" for key, effects in sorted(stateful.items())
            if key in measured]
