"""Which ``tf.lite.TFLiteConverter`` attributes kiln honours, which it only knows, and the
checks on their names and values.

A converter that silently takes a misspelt or unimplemented option writes a model that looks
right and is not. So `TFLiteConverter` refuses a name neither it nor TF's converter has (with
the nearest known name), and `convert()` warns about each TF option kiln does not honour that
was set to anything but TF's default. The tables list TF 2.21's attributes (TFLiteConverterV2
and TargetSpec, tensorflow/lite/python/lite.py) with TF's default values.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Iterable

import numpy as np

from ..errors import ConversionError


class UnknownAttributeError(ConversionError, AttributeError):
    """A converter attribute that neither kiln nor TensorFlow's converter has (a typo)."""


class IgnoredOptionWarning(UserWarning):
    """A TensorFlow converter option kiln accepts but does not honour was set."""


_NOT_IMPLEMENTED = "kiln does not implement it"
_MLIR_DEBUG = ("an MLIR debugging option; kiln has no MLIR (converter.report and experimental_verify_passes "
               "are its debugging aids)")
_ONE_QUANTIZER = "kiln has one quantizer (kiln.quant), whatever this selects"

#: TFLiteConverter attributes of TF 2.21 that kiln does not honour: name -> (TF's default, why).
CONVERTER_IGNORED: dict[str, tuple[object, str]] = {
    "experimental_new_converter": (True, "kiln has one converter, its own; TF's legacy TOCO is not in it"),
    "experimental_new_quantizer": (True, _ONE_QUANTIZER),
    "experimental_new_dynamic_range_quantizer": (True, _ONE_QUANTIZER),
    "experimental_use_stablehlo_quantizer": (False, _ONE_QUANTIZER),
    "experimental_stablehlo_quantizer_config": (None, _ONE_QUANTIZER),
    "experimental_lower_to_saved_model": (True, "kiln traces Keras models directly"),
    "unfold_batchmatmul": (False, _NOT_IMPLEMENTED),
    "legalize_custom_tensor_list_ops": (False, _NOT_IMPLEMENTED),
    "model_origin_framework": ("UNSET", _NOT_IMPLEMENTED),
    "canonicalizing_inf_as_min_max_float": (True, _NOT_IMPLEMENTED),
    "serialize_debug_metadata": (False, "kiln writes no debug metadata"),
    **{name: (None, _MLIR_DEBUG) for name in (
        "ir_dump_dir", "ir_dump_pass_regex", "ir_dump_func_regex", "enable_timing", "print_ir_before",
        "print_ir_after", "print_ir_module_scope", "elide_elementsattrs_if_larger")},
    "_experimental_disable_per_channel": (
        False, "kiln quantizes convolution and FULLY_CONNECTED weights per channel, as TF does by default, "
               "and has no per-tensor switch"),
    "_experimental_disable_per_channel_quantization_for_dense_layers": (
        False, "kiln quantizes FULLY_CONNECTED weights per channel, as TF does by default"),
    "_experimental_full_integer_quantization_bias_type": (
        None, "kiln writes TF's default bias types (int32; int64 for 16x8)"),
    "_experimental_use_buffer_offset": (
        False, "kiln.save_model(model, path, external_buffers=True) writes the buffers after the tables"),
    **{name: (default, _NOT_IMPLEMENTED) for name, default in (
        ("_experimental_calibrate_only", False), ("_experimental_sparsify_model", False),
        ("_experimental_low_bit_qat", False), ("_experimental_variable_quantization", False),
        ("_experimental_strict_qdq", False), ("_experimental_qdq_conversion_mode", None),
        ("_experimental_reduce_type_precision", False), ("_experimental_quantization_options", None),
        ("_experimental_tf_quantization_mode", None), ("_experimental_lower_tensor_list_ops", True),
        ("_experimental_default_to_single_batch_in_tensor_list_ops", False),
        ("_experimental_unfold_large_splat_constant", False), ("_experimental_allow_all_select_tf_ops", False),
        ("_experimental_disable_fuse_mul_and_fc", False), ("_experimental_enable_composite_direct_lowering", True),
        ("_experimental_unsafe_fuse_dynamic_shaped_broadcast", False),
        ("_experimental_enable_dynamic_update_slice", False), ("_experimental_preserve_assert_op", False),
        ("_experimental_guarantee_all_funcs_one_use", False))},
}

#: TargetSpec attributes of TF 2.21 that kiln does not honour: name -> (TF's default, why).
TARGET_SPEC_IGNORED: dict[str, tuple[object, str]] = {
    "experimental_select_user_tf_ops": (set(), "kiln has no SELECT_TF_OPS (TensorFlow kernels inside LiteRT)"),
    "experimental_supported_backends": (None, _NOT_IMPLEMENTED),
    "_experimental_custom_op_registerers": (
        [], "kiln's Interpreter takes Python registerers: Interpreter(custom_op_registerers=[...])"),
    "_experimental_supported_accumulation_type": (None, _NOT_IMPLEMENTED),
}


def defaults(table: dict[str, tuple[object, str]]) -> dict[str, object]:
    """Fresh copies of the table's default values (a mutable default is never shared)."""
    return {name: (type(default)() if isinstance(default, (set, list)) else default)
            for name, (default, _) in table.items()}


def refuse_unknown(owner: str, name: str, honoured: Iterable[str], ignored: Iterable[str]) -> UnknownAttributeError:
    """The error for setting ``owner.name`` that no table knows, naming the nearest known name
    (or, with none near, the attributes kiln honours)."""
    known = sorted(set(honoured) | set(ignored))
    public = sorted(k for k in honoured if not k.startswith("_"))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = (f"; did you mean {close[0]!r}?" if close else
            f"; the attributes kiln honours are {', '.join(public)}")
    return UnknownAttributeError(f"{owner} has no attribute {name!r} (neither kiln's nor TensorFlow's "
                                 f"converter){hint}")


class CheckedAttributes:
    """A TF-compatible options object: its attributes are the names it honours (``_HONOURED``)
    and the TF ones it only knows (``_IGNORED``, a table of TF defaults and reasons, set to
    those defaults at creation); any other name is refused at once, with the nearest known one."""

    _HONOURED: frozenset[str] = frozenset()
    _IGNORED: dict[str, tuple[object, str]] = {}

    def _set_ignored_defaults(self) -> None:
        for name, value in defaults(self._IGNORED).items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name not in self._HONOURED and name not in self._IGNORED and not hasattr(type(self), name):
            raise refuse_unknown(type(self).__name__, name, self._HONOURED, self._IGNORED)
        object.__setattr__(self, name, value)


def _is_default(value, default) -> bool:
    if default is None or isinstance(default, bool):
        return value is default or (isinstance(value, (bool, np.bool_)) and bool(value) == default)
    if isinstance(default, (set, list)):
        try:
            return len(value) == 0
        except TypeError:
            return False
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # an array or another type that refuses ==: not the default
        return False


def warn_ignored(owner: str, obj, table: dict[str, tuple[object, str]], stacklevel: int) -> None:
    """One `IgnoredOptionWarning` per attribute of ``obj`` in ``table`` that is not TF's default."""
    for name, (default, why) in table.items():
        value = getattr(obj, name, default)
        if not _is_default(value, default):
            warnings.warn(f"{owner}.{name} = {value!r} is ignored: {why}", IgnoredOptionWarning,
                          stacklevel=stacklevel + 1)


def flag(owner: str, name: str, value) -> bool:
    """A boolean option's value; anything but True / False (or 0 / 1) is an error, since a
    string such as "False" would otherwise count as true."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise ConversionError(f"{owner}.{name} must be True or False, got {value!r} ({type(value).__name__})")


def members(enum_cls, value, what: str) -> set:
    """``value`` (a set / list / tuple of ``enum_cls`` members, kiln's or TF's enum; or None) as a
    set of ``enum_cls`` members. Names as strings are refused: TF's converter ignores them
    silently, so code relying on them would not port."""
    valid = ", ".join(m.name for m in enum_cls)
    kind = enum_cls.__name__
    if value is None:
        return set()
    if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, list, tuple)):
        example = f"{{kiln.{kind}.{next(iter(enum_cls)).name}}}"
        raise ConversionError(f"{what} must be a set of {kind} values, e.g. {example}, "
                              f"got {value!r} ({type(value).__name__}); accepted values: {valid}")
    out = set()
    for item in value:
        if isinstance(item, enum_cls):
            out.add(item)
            continue
        name = getattr(item, "name", None)
        if isinstance(item, str) or not isinstance(name, str) or name not in enum_cls.__members__ \
                or type(item).__name__ != kind:
            shown = f"the string {item!r}" if isinstance(item, str) else repr(item)
            hint = f"kiln.{kind}.{item} or tf.lite.{kind}.{item}" if isinstance(item, str) and item in \
                enum_cls.__members__ else f"one of kiln.{kind} / tf.lite.{kind}: {valid}"
            raise ConversionError(f"{what} holds {shown}; use {hint}")
        out.add(enum_cls[name])
    return out
