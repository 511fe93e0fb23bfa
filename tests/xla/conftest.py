"""The runtime zoo fixture, shared with tests/runtime."""

from tests.runtime.conftest import zoo  # noqa: F401 - a fixture
