"""`TFLiteConverter`: the `tf.lite.TFLiteConverter` API over kiln's converter.

    converter = kiln.TFLiteConverter.from_keras_model(model)
    tflite_bytes = converter.convert()
    print(converter.report)

Sources: Keras models (Keras 3 and tf_keras), SavedModel directories, concrete functions.
The attributes are TF's (quantization options included); kiln/converter/attributes.py says
which TF attributes kiln does not honour, and refuses names neither converter has.
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import ConversionError
from .attributes import CONVERTER_IGNORED, TARGET_SPEC_IGNORED, CheckedAttributes, flag, members, warn_ignored
from .keras.layers import prepare_keras_model
from .metadata import ModelType
from .options import ConversionOptions, Optimize, OpsSet
from .pipeline import FunctionSpec, Pipeline
from .report import ConversionReport
from .tfutil import tf


def _dtype_name(value) -> str:
    """'float32', 'int8', ... for tf / numpy dtypes and type objects."""
    if value is None:
        return "float32"
    try:
        return tf().as_dtype(value).name
    except TypeError:   # tf.as_dtype refuses the user's value
        raise ConversionError(f"unknown type {value!r}") from None


class TargetSpec(CheckedAttributes):
    """``converter.target_spec``: what the target runtime supports.

    TF's other TargetSpec attributes are accepted and, set to anything but TF's default, make
    ``convert()`` warn that kiln ignores them; an attribute neither has is an error.
    """

    _HONOURED = frozenset({"supported_ops", "supported_types"})
    _IGNORED = TARGET_SPEC_IGNORED

    def __init__(self):
        self.supported_ops: set = {OpsSet.TFLITE_BUILTINS}
        self.supported_types: set = set()
        self._set_ignored_defaults()

    def __repr__(self) -> str:
        return f"TargetSpec(supported_ops={self.supported_ops}, supported_types={self.supported_types})"


class TFLiteConverter(CheckedAttributes):
    """Converts TensorFlow models to LiteRT flatbuffers, like ``tf.lite.TFLiteConverter``.

    Build one with `from_keras_model`, `from_saved_model` or `from_concrete_functions`, set the
    attributes, call `convert()`. After converting, ``report`` holds a `ConversionReport`.

    Attributes:
      allow_custom_ops: TF ops without a builtin become CUSTOM ops (custom code = TF op type,
        attributes in a FlexBuffer) instead of failing the conversion.
      optimizations: set of `Optimize` values; any of them asks for quantization.
      representative_dataset: calibration data for integer quantization.
      target_spec: `TargetSpec` (supported_ops, supported_types).
      inference_input_type / inference_output_type: float32 unless integer-quantized.
      experimental_enable_resource_variables: keep assigned variables as resource variables.
      exclude_conversion_metadata: leave the CONVERSION_METADATA entry out of the model (as TF).
      denylist: op types ("SOFTMAX") or output tensor names to keep float when quantizing —
        kiln's extension; TF takes them only through its debugger's options.
      allow_integer_samples: accept integer representative samples for float inputs as they
        are — kiln's extension; by default they raise (usually un-normalised data).
      report: the `ConversionReport` of the last ``convert()``.

    TF's other attributes (``experimental_new_converter``, ``_experimental_disable_per_channel``,
    ...; kiln/converter/attributes.py lists them) are accepted, and ``convert()`` warns
    (`IgnoredOptionWarning`) about each one set to anything but TF's default. Setting an
    attribute neither converter has (``optimisations``) raises an AttributeError naming the
    nearest known one.
    """

    #: The attributes kiln reads (TF's, then kiln's own), besides CONVERTER_IGNORED's.
    _HONOURED = frozenset({
        "allow_custom_ops", "optimizations", "representative_dataset", "target_spec", "inference_input_type",
        "inference_output_type", "experimental_enable_resource_variables", "exclude_conversion_metadata",
        "saved_model_dir", "denylist", "allow_integer_samples", "experimental_verify_passes", "report", "model",
        "_specs", "_model_type", "_trackable_obj", "_keras_decisions"})
    _IGNORED = CONVERTER_IGNORED

    def __init__(self, specs: list[FunctionSpec], *, model_type: ModelType, trackable_obj: Any = None):
        self._specs = specs
        self._model_type = model_type
        self._trackable_obj = trackable_obj  # keeps captured variables alive
        self.allow_custom_ops = False
        self.optimizations: set = set()
        self.representative_dataset = None
        self.target_spec = TargetSpec()
        self.inference_input_type = None
        self.inference_output_type = None
        self.experimental_enable_resource_variables = True
        self.exclude_conversion_metadata = False
        self.saved_model_dir = None  # the source directory, for from_saved_model (read only, as in TF)
        self.denylist: list[str] = []
        self.allow_integer_samples = False
        #: Check the IR's invariants (use-def links, order) after every pass (slower; for debugging).
        self.experimental_verify_passes = False
        self.report: ConversionReport | None = None
        self.model = None  # the IR of the last conversion
        self._keras_decisions: list = []  # what tracing decided (Keras layers routed to fusions)
        self._set_ignored_defaults()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_concrete_functions(cls, funcs, trackable_obj=None) -> "TFLiteConverter":
        """Convert ``tf.function`` concrete functions (one signature each)."""
        funcs = list(funcs)
        if not funcs:
            raise ConversionError("No ConcreteFunction is specified.")
        specs = []
        for fn in funcs:
            if not hasattr(fn, "graph") or not hasattr(fn, "structured_input_signature"):
                raise ConversionError(
                    f"from_concrete_functions expects ConcreteFunctions (tf.function(...).get_concrete_function()), "
                    f"got {type(fn).__name__}")
            key = "serving_default" if len(funcs) == 1 else _function_key(fn)
            specs.append(FunctionSpec(key, fn, _input_names(fn), _output_names(fn)))
        return cls(specs, model_type=ModelType.TF_CONCRETE_FUNCTIONS, trackable_obj=trackable_obj)

    @classmethod
    def from_saved_model(cls, saved_model_dir, signature_keys=None, tags=None) -> "TFLiteConverter":
        """Convert the signatures ``signature_keys`` (default: serving_default) of a SavedModel."""
        t = tf()
        try:
            loaded = t.saved_model.load(str(saved_model_dir), tags=None if tags is None else list(tags))
        except (OSError, ValueError, RuntimeError) as exc:  # what TF raises on a bad directory
            raise ConversionError(f"cannot load SavedModel {saved_model_dir!r}: {exc}") from exc
        available = dict(getattr(loaded, "signatures", {}) or {})
        if signature_keys is None:
            if "serving_default" in available:
                signature_keys = ["serving_default"]
            elif len(available) == 1:
                signature_keys = list(available)
            else:
                signature_keys = sorted(available)
        if not signature_keys:
            raise ConversionError(f"SavedModel {saved_model_dir!r} has no signatures to convert")
        specs = []
        for key in signature_keys:
            if key not in available:
                raise ConversionError(
                    f"Invalid signature key '{key}' found. Valid keys are '{','.join(sorted(available))}'.")
            fn = available[key]
            specs.append(FunctionSpec(key, fn, _input_names(fn), _output_names(fn)))
        converter = cls(specs, model_type=ModelType.TF_SAVED_MODEL, trackable_obj=loaded)
        converter.saved_model_dir = saved_model_dir
        return converter

    @classmethod
    def from_keras_model(cls, model) -> "TFLiteConverter":
        """Convert a Keras model (Keras 3 or tf_keras) called in inference mode."""
        # Recurrent layers kiln can fuse trace through composites while this is active.
        with prepare_keras_model(model) as keras_report:
            fn = _keras3_function(model) if _is_keras3(model) else _tf_keras_function(model)
        spec = FunctionSpec("serving_default", fn, _input_names(fn), _output_names(fn))
        converter = cls([spec], model_type=ModelType.KERAS_MODEL, trackable_obj=model)
        converter._keras_decisions = keras_report.decisions()
        return converter

    # -- conversion -------------------------------------------------------------------------
    def convert(self) -> bytes:
        """Convert; returns the .tflite model bytes (``report`` describes the result)."""
        options = self.conversion_options()
        warn_ignored("TFLiteConverter", self, CONVERTER_IGNORED, stacklevel=2)
        warn_ignored("TFLiteConverter.target_spec", self.target_spec, TARGET_SPEC_IGNORED, stacklevel=2)
        pipeline = Pipeline.from_options(options)
        self.report = ConversionReport()
        conversion = pipeline.run(self._specs, options, self.report)
        # What tracing decided about Keras layers comes first: it happened first.
        self.report.decisions[:0] = self._keras_decisions
        self.model = conversion.model
        return conversion.data

    def conversion_options(self) -> ConversionOptions:
        """The converter's attributes as one frozen, checked `ConversionOptions`.

        Raises:
          ConversionError: an unknown or inconsistent option (as TF's converter says it).
          UnsupportedError: SELECT_TF_OPS.
        """
        optimizations = members(Optimize, self.optimizations, "optimizations")
        ops = members(OpsSet, self.target_spec.supported_ops, "target_spec.supported_ops") or {OpsSet.TFLITE_BUILTINS}
        types = {_dtype_name(t) for t in _collection(self.target_spec.supported_types, "target_spec.supported_types")}
        owner = "TFLiteConverter"
        return ConversionOptions(
            model_type=self._model_type,
            allow_custom_ops=flag(owner, "allow_custom_ops", self.allow_custom_ops),
            enable_resource_variables=flag(owner, "experimental_enable_resource_variables",
                                           self.experimental_enable_resource_variables),
            verify_passes=flag(owner, "experimental_verify_passes", self.experimental_verify_passes),
            conversion_metadata=not flag(owner, "exclude_conversion_metadata", self.exclude_conversion_metadata),
            optimizations=frozenset(optimizations), supported_ops=frozenset(ops),
            supported_types=frozenset(types),
            inference_input_type=_dtype_name(self.inference_input_type),
            inference_output_type=_dtype_name(self.inference_output_type),
            representative_dataset=_dataset(self.representative_dataset), denylist=_denylist(self.denylist),
            allow_integer_samples=bool(self.allow_integer_samples))


def _collection(value, what: str):
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, list, tuple)):
        raise ConversionError(f"{what} must be a set, got {value!r} ({type(value).__name__})")
    return value


def _dataset(value):
    """TF's ``tf.lite.RepresentativeDataset(gen)`` wrapper is accepted as TF accepts it: its generator."""
    if value is not None and not callable(value) and callable(getattr(value, "input_gen", None)):
        return value.input_gen
    return value


def _denylist(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(name, str) for name in value):
        raise ConversionError(f"denylist must be a list of op types or tensor names (strings), got {value!r}")
    return tuple(value)


# -- function discovery --------------------------------------------------------------------------

def _function_key(fn) -> str:
    name = getattr(fn, "name", None) or fn.graph.name
    name = name.decode() if isinstance(name, bytes) else str(name)
    for prefix in ("__inference_", "__forward_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit() else name


def _input_names(fn) -> list[str]:
    """Signature input names: the TensorSpec names, else the argument names."""
    t = tf()
    args, kwargs = fn.structured_input_signature
    captured = {id(internal) for _, internal in fn.graph.captures}
    placeholders = [x for x in fn.graph.inputs if id(x) not in captured]
    specs = t.nest.flatten((args, kwargs))
    specs = [s for s in specs if isinstance(s, t.TensorSpec)]
    keys = [p for p, _ in _flat_paths(kwargs)] if kwargs and not args else []
    names = []
    for i, ph in enumerate(placeholders):
        spec = specs[i] if i < len(specs) else None
        if keys and i < len(keys):
            name = keys[i]
        elif spec is not None and spec.name:
            name = spec.name
        else:
            name = ph.op.name
        names.append(name)
    return _dedupe(names)


def _flat_paths(structure) -> list[tuple[str, Any]]:
    from tensorflow.python.util import nest

    return [(path, value) for path, value in nest.flatten_with_joined_string_paths(structure)]


def _output_names(fn) -> list[str]:
    """Signature output names as TF writes them: dict keys, else output_0, output_1, ..."""
    t = tf()
    structured = fn.structured_outputs
    if isinstance(structured, dict):
        names = [path for path, _ in _flat_paths(structured)]
    else:
        names = [f"output_{i}" for i in range(len(t.nest.flatten(structured)))]
    if len(names) != len(fn.outputs):
        names = [f"output_{i}" for i in range(len(fn.outputs))]
    return _dedupe(names)


def _dedupe(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            n = f"{n}_{seen[n]}"
        else:
            seen[n] = 0
        out.append(n)
    return out


def _is_keras3(model) -> bool:
    try:
        import keras
    except ImportError:  # pragma: no cover
        return False
    return keras.__version__.startswith("3") and isinstance(model, keras.layers.Layer)


def _keras3_function(model):
    """The inference concrete function of a Keras 3 model, traced as TF's converter does."""
    import keras

    t = tf()
    if isinstance(model, (keras.src.models.Functional, keras.src.models.Sequential)):
        signature = t.nest.map_structure(lambda x: t.TensorSpec(x.shape, dtype=x.dtype, name=x.name), model.inputs)
        if isinstance(signature, list) and len(signature) > 1:
            signature = [signature]
    else:
        from keras.src.export.export_utils import get_input_signature

        try:
            specs = get_input_signature(model)
        except ValueError as exc:  # Keras: a model without a known input signature
            raise ConversionError(f"cannot trace the Keras model: {exc}") from exc
        signature = t.nest.map_structure(
            lambda s: t.TensorSpec(s.shape, dtype=s.dtype, name=getattr(s, "name", None)), specs)
    call = functools.partial(model.__call__, training=False)
    return t.function(call, input_signature=signature, autograph=False).get_concrete_function()


def _tf_keras_function(model):
    """tf_keras (Keras 2) models: the serving function tf_keras saves (outputs by layer name)."""
    try:
        from tf_keras.src.saving.legacy import saving_utils
    except ImportError as exc:  # pragma: no cover
        raise ConversionError(f"cannot convert {type(model).__name__}: not a Keras model ({exc})") from exc
    try:
        # As the SavedModel tf_keras writes (TF's converter's first route): batch left dynamic.
        return saving_utils.trace_model_call(model)
    except Exception as exc:  # noqa: BLE001 - Keras raises many kinds on untraceable models
        raise ConversionError(f"cannot trace the Keras model: {exc}") from exc
