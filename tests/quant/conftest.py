"""The quantization tests pin kiln's own integer kernels and its quantized delegate, bit for
bit, to LiteRT's reference kernels (BUILTIN_REF). With ai-edge-litert installed the default
Interpreter hands builtin partitions to LiteRT's optimised kernels, which round differently
(they are LiteRT's own business; tests/runtime/test_litert_delegate.py checks kiln runs them
exactly as LiteRT does), so here the default Interpreter is kiln's as without ai-edge-litert
— its compiled and quantized delegates — whatever ``--kiln-backend`` says: many tests are
about those delegates, and the reference kernels are compared explicitly (``REF``)."""

import pytest


@pytest.fixture(autouse=True)
def _kiln_delegates(kiln_default):
    pass
