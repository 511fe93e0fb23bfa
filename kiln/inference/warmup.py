"""TF Serving warm-up records (``assets.extra/tf_serving_warmup_requests``).

TF Serving replays these at every model load and aborts the load when one fails, so a record
must be harmless and must run: a signature that changes state (assigns a variable, writes a file)
gets none — replaying ``set_w`` with zeros would leave a model answering zeros. Inputs come from
real samples (the user's evaluation data or held-out representative samples), else zeros and
empty strings. Every record is replayed through the input model at conversion, and a signature
whose record fails there (e.g. an empty string that does not parse as a number) gets none, with
the reason in the report, instead of a record that would abort TF Serving's load.

TF Serving reads a TFRecord of ``tensorflow.serving.PredictionLog`` protos. The
tensorflow-serving-api wheel requires the full ``tensorflow`` package (not tensorflow-cpu), so
kiln builds the few messages it needs itself, with TF Serving's field numbers
(prediction_log.proto, predict.proto, model.proto), in a private descriptor pool so a later
``import tensorflow_serving`` cannot clash with them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

WARMUP_FILE = "tf_serving_warmup_requests"
MAX_RECORDS = 1000  # TF Serving reads at most this many


@lru_cache(maxsize=None)
def messages() -> dict:
    from google.protobuf import descriptor_pb2 as d
    from google.protobuf import descriptor_pool, message_factory
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.DescriptorPool()
    added = set()

    def add(fd):  # dependencies first
        if fd.name in added:
            return
        added.add(fd.name)
        for dep in fd.dependencies:
            add(dep)
        fp = d.FileDescriptorProto()
        fd.CopyToProto(fp)
        pool.Add(fp)

    add(tensor_pb2.DESCRIPTOR)

    F = d.FieldDescriptorProto
    fp = d.FileDescriptorProto(name="tensorflow_serving/apis/kiln_warmup.proto", package="tensorflow.serving",
                               syntax="proto3", dependency=["tensorflow/core/framework/tensor.proto"])
    spec = fp.message_type.add(name="ModelSpec")
    spec.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    spec.field.add(name="signature_name", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    req = fp.message_type.add(name="PredictRequest")
    entry = req.nested_type.add(name="InputsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tensorflow.TensorProto")
    req.field.add(name="model_spec", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                  type_name=".tensorflow.serving.ModelSpec")
    req.field.add(name="inputs", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                  type_name=".tensorflow.serving.PredictRequest.InputsEntry")
    req.field.add(name="output_filter", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    log = fp.message_type.add(name="PredictLog")
    log.field.add(name="request", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                  type_name=".tensorflow.serving.PredictRequest")
    plog = fp.message_type.add(name="PredictionLog")
    plog.field.add(name="predict_log", number=6, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                   type_name=".tensorflow.serving.PredictLog")
    pool.Add(fp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
            for name in ("ModelSpec", "PredictRequest", "PredictLog", "PredictionLog")}


def representative_inputs(signature_def, batch: int) -> dict:
    """Zeros (empty strings) for each input: batch size ``batch``, other unknown dims 1."""
    import numpy as np
    import tensorflow as tf

    feeds = {}
    for key, info in signature_def.inputs.items():
        dims = [] if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
        if info.tensor_shape.unknown_rank:
            dims = [batch]
        shape = [batch if i == 0 and d < 0 else (1 if d < 0 else d) for i, d in enumerate(dims)]
        dtype = tf.dtypes.as_dtype(info.dtype)
        if dtype == tf.string:
            feeds[key] = np.full(shape, b"", dtype=object)
        else:
            feeds[key] = np.zeros(shape, dtype=dtype.as_numpy_dtype)
    return feeds


def _string_inputs(signature) -> list[str]:
    """Names of the string inputs of a SignatureDef or of a loaded signature's input specs."""
    if isinstance(signature, dict):
        return sorted(k for k, spec in signature.items() if spec.dtype.name == "string")
    return sorted(k for k, info in signature.inputs.items() if info.dtype == 7)  # DT_STRING


def model_signature(loaded, key: str) -> dict:
    return loaded.signatures[key].structured_input_signature[1]


def _rows_to(sample: dict, rows: int) -> dict:
    """The sample's rows repeated (or cut) to ``rows`` along dimension 0."""
    import numpy as np

    out = {}
    for name, value in sample.items():
        value = np.asarray(value)
        if value.ndim == 0 or value.shape[0] == 0:
            return {}
        out[name] = np.take(value, np.arange(rows) % value.shape[0], axis=0)
    return out


def _length_to(feeds: dict, name: str, dim: int, length: int) -> dict:
    """``feeds`` with dimension ``dim`` of input ``name`` (and of the inputs sharing its length there,
    e.g. a mask) repeated or cut to ``length``."""
    import numpy as np

    base = np.asarray(feeds[name])
    if base.ndim <= dim or base.shape[dim] == 0:
        return {}
    out = {}
    for key, value in feeds.items():
        value = np.asarray(value)
        if value.ndim > dim and value.shape[dim] == base.shape[dim]:
            value = np.take(value, np.arange(length) % value.shape[dim], axis=dim)
        out[key] = value
    return out


def plan(model, sizes: dict, samples: dict, stateful: dict, dimensions=()) -> tuple[list, list]:
    """(requests [(signature, feeds)], skipped [{"signature", "why"}]) for ``sizes`` (signature -> batch
    sizes); ``samples``: signature -> real samples or None; ``stateful``: signature -> what it changes;
    ``dimensions``: (input, dimension, sizes) buckets, warmed where a signature input has that name."""
    requests, skipped = [], []
    for key in sorted(sizes):
        if key in stateful:
            skipped.append({"signature": key, "why": f"it changes state ({stateful[key]}); TF Serving replays "
                                                    f"warm-up records at every load"})
            continue
        real = [s for s in (samples.get(key) or []) if _rows_to(s, 1)]
        signature_def = model.meta.signature_def[key]
        for n in sizes[key]:
            requests.append((key, _rows_to(real[0], n) if real else representative_inputs(signature_def, n)))
        first = requests[-len(sizes[key])][1] if sizes[key] else {}
        for name, dim, lengths in dimensions:
            info = signature_def.inputs.get(name)
            if info is None or info.tensor_shape.unknown_rank or len(info.tensor_shape.dim) <= dim \
                    or info.tensor_shape.dim[dim].size >= 0 or name not in first:
                continue
            requests += [(key, feeds) for feeds in (_length_to(first, name, dim, n) for n in lengths) if feeds]
    unique, seen = [], set()
    for key, feeds in requests:  # inputs bucketed together (ids and mask) give the same records
        shapes = (key, tuple(sorted((n, tuple(np.shape(v))) for n, v in feeds.items())))
        if shapes not in seen:
            seen.add(shapes)
            unique.append((key, feeds))
    return unique, skipped


def verify(model_dir: str, requests: list, guessed=()) -> tuple[list, list]:
    """(requests that run on the model in ``model_dir``, skipped [{"signature", "why"}] for the others).

    ``guessed``: signatures whose records hold zeros / empty strings (no real samples): a failure there
    says to give real inputs."""
    import numpy as np
    import tensorflow as tf

    from .evaluate import _first_line

    if not requests:
        return [], []
    loaded = tf.saved_model.load(model_dir)
    ok, failed = [], {}
    for key, feeds in requests:
        if key in failed:
            continue
        fn = loaded.signatures[key]
        specs = fn.structured_input_signature[1]
        try:
            fn(**{n: tf.constant(np.asarray(v), dtype=specs[n].dtype) for n, v in feeds.items() if n in specs})
        except Exception as exc:  # noqa: BLE001 (TensorFlow raises many kinds)
            rows = len(next(iter(feeds.values()))) if feeds else 0
            failed[key] = f"a {rows}-row record fails on the input model: {_first_line(exc)}"
            if key in guessed:
                strings = _string_inputs(model_signature(loaded, key))
                failed[key] += (f" (it holds {'empty strings for ' + str(strings) if strings else 'zeros'}: no real "
                                f"samples to take values from; give --evaluation_data)")
            continue
        ok.append((key, feeds))
    ok = [(k, f) for k, f in ok if k not in failed]
    return ok, [{"signature": k, "why": why} for k, why in sorted(failed.items())]


def write_records(path, requests) -> int:
    """``requests``: iterable of (signature key, feeds dict). Returns the number of records written."""
    import tensorflow as tf

    m = messages()
    n = 0
    with tf.io.TFRecordWriter(str(path)) as writer:
        for key, feeds in requests:
            if n >= MAX_RECORDS:
                break
            log = m["PredictionLog"]()
            req = log.predict_log.request
            req.model_spec.signature_name = key
            for name, value in feeds.items():
                req.inputs[name].ParseFromString(tf.make_tensor_proto(value).SerializeToString())
            writer.write(log.SerializeToString())
            n += 1
    return n


def read_records(path) -> list:
    """The PredictionLog messages of a warm-up file (for tests and ``kiln inspect``-style checks)."""
    import tensorflow as tf

    cls = messages()["PredictionLog"]
    return [cls.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
