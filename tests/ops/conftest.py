"""The op tests hold kiln's own kernels to LiteRT's, so the default Interpreter here keeps
them (the root conftest's `kiln_kernels`): with ai-edge-litert installed it would hand every
builtin op to LiteRT itself. `tests.harness.check_op` also runs each op through the LiteRT
delegate explicitly."""

import pytest


@pytest.fixture(autouse=True)
def _kiln_kernels(kiln_kernels):
    pass
