"""The "tf" backend of `kiln.runtime.open`: a SavedModel's signatures on TensorFlow.

TensorFlow is imported when a SavedModel is opened, never before. A TF function is
thread-safe, so every thread shares one runner. The MetaGraph's SignatureDefs are kept as
serialized protos, so a server can answer metadata requests with TensorFlow's exact text.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InterpreterError, ModelError
from .served import PREDICT_METHOD, Runner, ServedModel, Signature, TensorSpec


def _serve_meta_graph(path: Path):
    from tensorflow.core.protobuf import saved_model_pb2

    pb = path / "saved_model.pb"
    if not pb.is_file():
        raise ModelError(f"{path}: only binary saved_model.pb SavedModels are served")
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(pb.read_bytes())
    except Exception as exc:  # protobuf's DecodeError
        raise ModelError(f"{pb}: not a SavedModel proto: {exc}") from None
    graphs = [mg for mg in proto.meta_graphs if "serve" in mg.meta_info_def.tags]
    if not graphs:
        raise ModelError(f"{path}: no MetaGraph tagged 'serve'")
    return graphs[0]


def holds_batch_function(meta_graph) -> bool:
    """True when the graph or any library function calls ``BatchFunction`` (TF batches in-graph)."""
    graph = meta_graph.graph_def
    if any(n.op == "BatchFunction" for n in graph.node):
        return True
    return any(n.op == "BatchFunction" for f in graph.library.function for n in f.node_def)


def _tensor_spec(name: str, info) -> TensorSpec:
    import tensorflow as tf

    dtype = np.dtype(tf.dtypes.as_dtype(info.dtype).as_numpy_dtype)
    if dtype.kind in "SU":
        dtype = np.dtype(object)
    shape = None if info.tensor_shape.unknown_rank else tuple(int(d.size) for d in info.tensor_shape.dim)
    return TensorSpec(name, dtype, shape, info.name)


class _FunctionRunner(Runner):
    """The SavedModel's signature functions (thread-safe: shared by every thread)."""

    def __init__(self, functions: dict):
        self._functions = functions

    def run(self, signature_key, feeds):
        import tensorflow as tf

        function = self._functions.get(signature_key)
        if function is None:
            raise InterpreterError(f"signature {signature_key!r}: the model has {sorted(self._functions)}")
        try:
            out = function(**{n: tf.constant(v) for n, v in feeds.items()})
        except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError, ValueError, TypeError) as exc:
            raise InterpreterError(f"signature '{signature_key}': {_tf_message(exc)}") from None
        return {n: t.numpy() for n, t in out.items()}


_NOISE = ("Graph execution error", "Detected at node", "<stack traces", "[[", "File ")


def _tf_message(exc: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong (not where the graph was built)."""
    text = getattr(exc, "message", None) or str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(_NOISE):
            return line
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def open_saved_model(path: Path) -> ServedModel:
    import tensorflow as tf

    meta = _serve_meta_graph(path)
    loaded = tf.saved_model.load(os.fspath(path), tags=["serve"])
    signatures = {}
    for key, sig in meta.signature_def.items():
        if key.startswith("__"):  # __saved_model_init_op and friends are not callable signatures
            continue
        signatures[key] = Signature(key, {n: _tensor_spec(n, i) for n, i in sig.inputs.items()},
                                    {n: _tensor_spec(n, i) for n, i in sig.outputs.items()},
                                    sig.method_name or PREDICT_METHOD)
    functions = dict(loaded.signatures)
    missing = sorted(set(signatures) - set(functions))
    if missing:
        raise ModelError(f"{path}: signatures {missing} are in the MetaGraph but not callable")
    runner = _FunctionRunner({k: functions[k] for k in signatures})
    runner.keep_alive = loaded  # the functions need the loaded object's variables
    defs = {key: meta.signature_def[key].SerializeToString(deterministic=True) for key in signatures}
    return ServedModel(os.fspath(path), "savedmodel", "tf", signatures, lambda: runner, thread_safe=True,
                       has_batch_function=holds_batch_function(meta), signature_defs=defs)
