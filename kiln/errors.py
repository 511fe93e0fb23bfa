"""kiln's error hierarchy: every failure a user can trigger derives from KilnError.

Errors say what is wrong and where ("subgraph 0, tensor 12: ..."), so a user can find the
offending part of the model without a debugger.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises on purpose."""


class ModelError(KilnError, ValueError):
    """A .tflite model is malformed, truncated, hostile or inconsistent."""


class OpError(KilnError, RuntimeError):
    """An operator failed to prepare or execute (wrapped with the node it happened in)."""


class RegistrationError(OpError):
    """No kernel is registered for an operator (or for its version)."""


class InterpreterError(KilnError, ValueError):
    """The Interpreter API was used wrongly (bad index, shape or dtype, not allocated...)."""


class InterpreterStateError(InterpreterError, RuntimeError):
    """The Interpreter was called out of order (invoke before allocate_tensors): a RuntimeError
    as LiteRT raises it, and still an InterpreterError."""


class ConversionError(KilnError, ValueError):
    """A TensorFlow model could not be converted (a ValueError, as TF's converter raises for bad
    options and inputs, so code catching ValueError around ``convert()`` ports unchanged)."""


class UnsupportedError(KilnError, NotImplementedError):
    """A feature that kiln does not implement (yet) was requested."""
