"""The quantization tests pin kiln's own integer kernels, bit for bit, to LiteRT's reference
kernels (BUILTIN_REF). With ai-edge-litert installed the default Interpreter hands builtin
partitions to LiteRT's optimised kernels, which round differently (they are LiteRT's own
business; tests/runtime/test_litert_delegate.py checks kiln runs them exactly as LiteRT
does), so here the default Interpreter keeps kiln's own kernels (the root conftest's
`kiln_kernels`)."""

import pytest


@pytest.fixture(autouse=True)
def _kiln_kernels(kiln_kernels):
    pass
