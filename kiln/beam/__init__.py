"""Batch inference on Apache Beam: `KilnModelHandler` for RunInference.

Beam is an optional extra (``pip install kiln[beam]``). Importing this package without it
raises `BeamUnavailableError`, a KilnError that is also an ImportError, saying what to install.
"""

from __future__ import annotations

from kiln.errors import KilnError


class BeamUnavailableError(KilnError, ImportError):
    """apache-beam is not installed."""


try:
    import apache_beam  # noqa: F401
except ImportError as e:
    raise BeamUnavailableError(f"kiln.beam needs Apache Beam: pip install 'kiln[beam]' ({e})") from None

from .handler import KilnModelHandler, read_model_bytes  # noqa: E402
from .model import KilnModel, Signature, TensorSpec, model_spec  # noqa: E402

__all__ = ["BeamUnavailableError", "KilnModel", "KilnModelHandler", "Signature", "TensorSpec", "model_spec",
           "read_model_bytes"]
