"""Load one model version for serving, through `kiln.runtime.open`.

A version directory holds a ``.tflite`` file (served by kiln's runtime, LiteRT or kiln's XLA
delegate) or a SavedModel (served by TensorFlow). What the server needs on top of the runtime's
`ServedModel`: a load error that becomes the version's status, TF Serving's text for an unknown
signature, and the SignatureDefs as TF Serving prints them.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import KilnError
from ..runtime import served
from ..runtime.served import BACKENDS, DEFAULT_SIGNATURE, ServedModel, Signature, SignatureNotFound  # noqa: F401
from .status import InvalidArgument, NotFound
from .tensors import check_shape, dtype_name


class LoadError(Exception):
    """A version directory that cannot be served (the message says why; kept in the model status)."""


def find_model_file(version_dir: Path) -> tuple[str, Path]:
    """("savedmodel", dir) or ("tflite", file) for a version directory."""
    try:
        return served.find_model_file(version_dir)
    except KilnError as exc:
        raise LoadError(str(exc)) from None


def load(version_dir, backend: str = "kiln", num_threads: int | None = None, batch_sizes=None) -> ServedModel:
    """Load ``version_dir`` with ``backend`` (SavedModels always load with TensorFlow), prepared
    for the batching's ``batch_sizes`` (the xla backend compiles each at load)."""
    kind, path = find_model_file(Path(version_dir))
    if kind == "tflite" and backend == "tf":
        raise LoadError(f"{path}: --backend tf serves SavedModels; a .tflite file needs kiln, litert or xla")
    try:
        return served.open(path, "tf" if kind == "savedmodel" else backend, num_threads=num_threads,
                           batch_sizes=batch_sizes)
    except Exception as exc:  # any loader failure becomes the version's error status
        raise LoadError(f"{path}: cannot load with backend {backend!r}: {type(exc).__name__}: {exc}") from exc


def signature(model: ServedModel, name: str) -> Signature:
    """The signature a request names ("" for the default), or NotFound in TF Serving's words."""
    try:
        return model.signature(name or None)
    except SignatureNotFound:
        key = name or DEFAULT_SIGNATURE
        raise NotFound(f'Serving signature name: "{key}" not found in signature def '
                       f"(signatures: {', '.join(sorted(model.signatures)) or 'none'})") from None


def signature_def_json(model: ServedModel) -> dict:
    """``{"signature_def": {key: SignatureDef}}`` as TF Serving prints it: a SavedModel's own
    protos exactly, a .tflite's signatures in the same form (-1 for free dimensions)."""
    if model.signature_defs is not None:
        from google.protobuf import json_format
        from tensorflow.core.protobuf import meta_graph_pb2

        out = {}
        for key, data in model.signature_defs.items():
            proto = meta_graph_pb2.SignatureDef.FromString(data)
            out[key] = json_format.MessageToDict(proto, preserving_proto_field_name=True,
                                                 always_print_fields_with_no_presence=True)
        return {"signature_def": out}
    def info(spec):
        shape = {"dim": [], "unknown_rank": True} if spec.shape is None else {
            "dim": [{"size": str(d), "name": ""} for d in spec.shape], "unknown_rank": False}
        return {"dtype": dtype_name(spec.dtype), "tensor_shape": shape, "name": spec.tensor_name or spec.name}

    return {"signature_def": {
        key: {"inputs": {n: info(s) for n, s in sig.inputs.items()},
              "outputs": {n: info(s) for n, s in sig.outputs.items()},
              "method_name": sig.method_name, "defaults": {}}
        for key, sig in model.signatures.items()}}


def check_feeds(signature: Signature, feeds: dict) -> None:
    """Refuse what the model would fail on before it joins a batch (400 naming the input): a shape
    the signature does not take, unequal batch sizes of a batched signature, an index outside the
    table the model looks it up in."""
    for name, array in feeds.items():
        spec = signature.inputs.get(name)
        if spec is None:
            continue
        check_shape(array, spec)
        if spec.index_range is not None and (bad := spec.out_of_range(array)) is not None:
            low, high = spec.index_range
            raise InvalidArgument(f"input '{name}': index {bad} is outside [{low}, {high}), the rows of the table "
                                  "the model looks it up in")
    if len(feeds) > 1 and signature.batched:
        sizes = {n: (a.shape[0] if a.ndim else None) for n, a in feeds.items()}
        if len(set(sizes.values())) > 1:
            raise InvalidArgument("Batching input tensors supplied in a given op invocation must have equal "
                                  "0th-dimension size; got " + ", ".join(f"{n}: {s}" for n, s in sorted(sizes.items())))
