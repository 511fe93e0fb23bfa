"""Fixtures shared by the runtime tests: the converted model zoo and LiteRT oracles."""

from __future__ import annotations

import pytest

from tests.runtime import zoo as _zoo


class Zoo:
    """Lazy access to the zoo: a model is converted (once, cached on disk) on first use."""

    names = tuple(_zoo.ZOO)

    def path(self, name: str):
        return _zoo.zoo_path(name)

    def bytes(self, name: str) -> bytes:
        return _zoo.zoo_bytes(name)


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return Zoo()


def litert(model: bytes | str, **kwargs):
    """The official interpreter with its plain builtin kernels (no XNNPACK rewrite of the graph)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    key = "model_content" if isinstance(model, (bytes, bytearray)) else "model_path"
    return Interpreter(**{key: model}, **kwargs,
                       experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
