"""TF Serving warm-up records (``assets.extra/tf_serving_warmup_requests``).

TF Serving reads a TFRecord of ``tensorflow.serving.PredictionLog`` protos. The
tensorflow-serving-api wheel requires the full ``tensorflow`` package (not tensorflow-cpu), so
kiln builds the few messages it needs itself, with TF Serving's field numbers
(prediction_log.proto, predict.proto, model.proto), in a private descriptor pool so a later
``import tensorflow_serving`` cannot clash with them.
"""

from __future__ import annotations

from functools import lru_cache

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
