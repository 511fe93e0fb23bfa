"""kiln's optional extras (pyproject.toml) and the one line that names the pip command when
one is missing: checked before the work that needs it, without importing anything.

The runtime needs only numpy, flatbuffers and tflite; everything else is an extra. A missing one
must cost the user one line saying what to install, never an import traceback from deep inside.
"""

from __future__ import annotations

import importlib.util
import sys

from .errors import KilnError

#: extra -> the top-level modules of it that kiln cannot do without (the serve extra's uvloop,
#: orjson and threadpoolctl only make kiln serve faster: it runs without them).
EXTRAS: dict[str, tuple[str, ...]] = {
    "tf": ("tensorflow",),
    "xla": ("jax", "jaxlib"),
    "beam": ("apache_beam",),
    "serve": ("prometheus_client", "httptools", "h2", "hpack", "google.protobuf"),
}


class MissingExtraError(KilnError, ImportError):
    """An optional extra kiln needs for what was asked is not installed."""


def missing(extra: str, what: str, module: str) -> MissingExtraError:
    """The error for ``what`` (an option, an API; "" for the command in the error's prefix)
    lacking ``module`` of ``extra``."""
    return MissingExtraError(f"{what + ' ' if what else ''}needs the {extra!r} extra (no module named {module!r}): "
                             f"pip install 'kiln[{extra}]'")


def _absent(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is None   # None there blocks the import
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise `MissingExtraError` unless every module ``what`` needs of ``extra`` can be imported."""
    for module in EXTRAS[extra] if modules is None else modules:
        if _absent(module):
            raise missing(extra, what, module)


def from_import_error(exc: ImportError, what: str) -> MissingExtraError | None:
    """The extra an ImportError of a module of one stands for, as a `MissingExtraError`; else None."""
    name = getattr(exc, "name", None) or ""
    for extra, modules in EXTRAS.items():
        for module in modules:   # "google.protobuf" is missing when "google" is, and "jax.numpy" when "jax" is
            if name and (f"{name}.".startswith(f"{module}.") or module.startswith(f"{name}.")):
                return missing(extra, what, module)
    return None
