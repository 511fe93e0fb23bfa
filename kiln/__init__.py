"""kiln: take trained TensorFlow models to fast, portable LiteRT inference, in Python.

The curated public API. The converter needs TensorFlow (``pip install kiln[tf]``); it and the
fusion registry are imported on first use (PEP 562 ``__getattr__``), so ``import kiln`` loads
only the runtime, which works with numpy, flatbuffers and tflite alone.
"""

from __future__ import annotations

from .errors import (
    ConversionError,
    InterpreterError,
    KilnError,
    ModelError,
    OpError,
    RegistrationError,
    UnsupportedError,
)
from .format import read_model, save_model, write_model
from .runtime import (
    BuiltinOpResolver,
    Delegate,
    DelegateKernel,
    Interpreter,
    MutableOpResolver,
    NodeInfo,
    OpResolverType,
    Partition,
    Registration,
    SignatureRunner,
)
from .delegates import LiteRtDelegate  # importing kiln.delegates registers the default delegates
from .runtime import register_backend
from .schema import Activation, DType, Padding

__version__ = "0.1.0"

#: Public names defined outside the runtime: name -> (module, attribute), imported on first use.
_LAZY = {
    "TFLiteConverter": ("kiln.converter.api", "TFLiteConverter"),
    "Optimize": ("kiln.converter.api", "Optimize"),
    "OpsSet": ("kiln.converter.api", "OpsSet"),
    "quantize": ("kiln.quant.api", "quantize"),
    "QuantizationDebugger": ("kiln.quant.debug.debugger", "QuantizationDebugger"),
    "XlaDelegate": ("kiln.xla", "XlaDelegate"),
    "to_jax": ("kiln.xla", "to_jax"),
    **{name: ("kiln.fusion.registry", name)
       for name in ("CompositeCall", "NotFusable", "register_fusion", "unregister_fusion")},
}


#: Subpackages reachable as attributes of ``kiln`` without importing them up front.
_SUBPACKAGES = frozenset({"beam", "inference", "quant", "serve", "xla"})


def _xla_backend(batch_sizes=None, model_path=None):
    """`kiln.runtime.open`'s "xla" backend: kiln.xla sits above the runtime, so this facade
    hands it over (JAX is imported, and its absence reported, only when a model opens on it).
    Each interpreter's delegate keeps its weights on the device and compiles ``batch_sizes``'
    buckets as it loads — from the export next to the model (``MODEL.tflite.xla``) if there is one."""
    import os

    from .runtime.served import XLA_SHAPES
    from .xla import XlaDelegate, require_jax
    from .xla.exported import default_path

    require_jax()
    export = default_path(model_path) if model_path is not None else None
    export = export if export is not None and os.path.isfile(export) else None
    return lambda: [XlaDelegate(cache_size=XLA_SHAPES, batch_sizes=batch_sizes, export=export)]


register_backend("xla", _xla_backend)


def __getattr__(name: str):
    """Import converter and fusion names on first use (the converter pulls in TensorFlow)."""
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"kiln.{name}")
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


__all__ = [
    "Activation", "BuiltinOpResolver", "CompositeCall", "ConversionError", "DType", "Delegate",
    "DelegateKernel", "Interpreter", "InterpreterError", "KilnError", "LiteRtDelegate", "ModelError",
    "MutableOpResolver", "NodeInfo", "NotFusable", "OpError", "OpResolverType", "Optimize", "OpsSet", "Padding", "Partition",
    "QuantizationDebugger", "Registration", "RegistrationError", "SignatureRunner", "TFLiteConverter", "UnsupportedError",
    "XlaDelegate", "quantize", "read_model",
    "register_fusion", "save_model", "to_jax", "unregister_fusion", "write_model", "__version__",
]
