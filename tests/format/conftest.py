"""The format tests use the runtime zoo (models written by TensorFlow's converter)."""

from tests.runtime.conftest import zoo  # noqa: F401  (pytest fixture)
