"""Small helpers over TensorFlow's graph objects (imported lazily: TF is an optional extra), and
the command line's quiet import of it."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any

from .. import extras
from ..errors import ConversionError
from ..schema import DType


@functools.lru_cache(maxsize=None)
def tf():
    """The tensorflow module (a clear error when the `tf` extra is not installed)."""
    try:
        import tensorflow
    except ImportError as exc:
        raise extras.missing("tf", "converting TensorFlow models", "tensorflow") from exc
    return tensorflow


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up log (oneDNN, CUDA, CPU-feature lines) kept off
    stderr, and its Python deprecation warnings off. A user who sets TF_CPP_MIN_LOG_LEVEL
    gets TensorFlow's logging as they asked for it.

    For the command line only: a library leaves the host process's stderr and logging alone.
    """
    if "tensorflow" in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)  # absl writes its pre-initialisation lines straight to fd 2
        try:
            import tensorflow as tf
        except ImportError:  # the command says what to install
            return
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    tf.get_logger().setLevel("ERROR")  # "WARNING:tensorflow:From ...: ... is deprecated"
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - TensorFlow depends on absl
        pass
    for package in ("tensorflow", "keras", "tf_keras"):
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=package)
        warnings.filterwarnings("ignore", category=FutureWarning, module=package)


def to_dtype(tf_dtype) -> DType:
    """LiteRT tensor type of a TensorFlow dtype."""
    t = tf()
    dt = t.as_dtype(tf_dtype)
    if dt == t.resource:
        return DType.RESOURCE
    if dt == t.variant:
        return DType.VARIANT
    if dt == t.string:
        return DType.STRING
    if dt == t.bfloat16:
        return DType.BFLOAT16
    try:
        return DType.from_numpy(dt.as_numpy_dtype)
    except (TypeError, ValueError):  # as_numpy_dtype / DType.from_numpy refuse TF-only types
        raise ConversionError(f"TensorFlow type {dt.name} has no LiteRT tensor type") from None


def shape_signature(shape) -> tuple[int, ...] | None:
    """A TensorShape as a tuple with -1 for unknown dims; None when even the rank is unknown."""
    if shape.rank is None:
        return None
    return tuple(-1 if d is None else int(d) for d in shape.as_list())


def static_shape(signature: tuple[int, ...]) -> tuple[int, ...]:
    """The file's ``shape`` for a signature: dynamic dims become 1, as TF's converter writes."""
    return tuple(1 if d < 0 else d for d in signature)


def attr_value(value) -> Any:
    """An AttrValue proto as a plain Python value (lists, strings, dtypes as names, shapes)."""
    kind = value.WhichOneof("value")
    if kind == "list":
        lst = value.list
        for field in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            items = getattr(lst, field)
            if len(items):
                return [_scalar_attr(field, v) for v in items]
        return []
    if kind is None:
        return None
    return _scalar_attr(kind, getattr(value, kind))


def attr_text(v: bytes) -> str | bytes:
    """A string attribute as text, or as the bytes it holds when they are not UTF-8."""
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(v)


def _scalar_attr(kind: str, v) -> Any:
    t = tf()
    if kind == "s":
        return attr_text(v)
    if kind in ("i", "f", "b"):
        return v
    if kind == "type":
        return t.as_dtype(v).name
    if kind == "shape":
        return None if v.unknown_rank else [int(d.size) for d in v.dim]
    if kind == "tensor":
        return t.make_ndarray(v)
    if kind == "func":
        return {"name": v.name, **{k: attr_value(a) for k, a in v.attr.items()}}
    if kind == "placeholder":
        return v
    return v


#: id(graph) -> (graph, {function name: FuncGraph}); emptied after each conversion.
_FUNCTION_GRAPHS: dict[int, tuple] = {}


def clear_function_cache() -> None:
    _FUNCTION_GRAPHS.clear()


def function_graph(graph, name: str):
    """The FuncGraph of library function ``name`` reachable from ``graph`` (memoised)."""
    entry = _FUNCTION_GRAPHS.get(id(graph))
    if entry is None or entry[0] is not graph:
        entry = _FUNCTION_GRAPHS[id(graph)] = (graph, {})
    cache = entry[1]
    fg = cache.get(name)
    if fg is None:
        fg = cache[name] = _function_graph(graph, name)
    return fg


def _function_graph(graph, name: str):
    g = graph
    while g is not None:
        fn = g._get_function(name)  # noqa: SLF001 - TF exposes no public accessor
        if fn is not None:
            fg = getattr(fn, "graph", None)
            if fg is not None:
                return fg
            return _graph_from_definition(g, fn.definition)
        g = getattr(g, "outer_graph", None)
    # Functions only present in the serialized library (e.g. loaded SavedModels).
    fdef = _find_fdef(graph, name)
    if fdef is None:
        raise ConversionError(f"function {name!r} is not in the graph's function library")
    return _graph_from_definition(graph, fdef)


def function_def(graph, name: str):
    """The FunctionDef of library function ``name`` (None if absent)."""
    g = graph
    while g is not None:
        fn = g._get_function(name)  # noqa: SLF001
        if fn is not None:
            return fn.definition
        g = getattr(g, "outer_graph", None)
    return _find_fdef(graph, name)


def _find_fdef(graph, name: str):
    for fdef in graph.as_graph_def().library.function:
        if fdef.signature.name == name:
            return fdef
    return None


def _graph_from_definition(graph, fdef):
    from tensorflow.python.framework import function_def_to_graph

    with graph.as_default():
        return function_def_to_graph.function_def_to_graph(fdef)


def implements_name(fdef) -> tuple[str | None, dict]:
    """The composite name of a function (``_implements`` or tf_keras' ``api_implements``)
    and its attributes; (None, {}) for ordinary functions."""
    if fdef is None:
        return None, {}
    attrs = fdef.attr
    for key in ("_implements", "api_implements"):
        if key not in attrs:
            continue
        value = attrs[key]
        attr_dict = {k: attr_value(v) for k, v in attrs.items()
                     if k not in ("_implements", "api_implements") and not k.startswith("_")}
        if value.WhichOneof("value") == "func":
            func = value.func
            attr_dict.update({k: attr_value(v) for k, v in func.attr.items()})
            return func.name, attr_dict
        name = attr_value(value)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        return str(name), attr_dict
    return None, {}
