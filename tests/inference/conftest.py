"""Fixtures the inference converter's test modules share: a scratch folder per module, the toy
SavedModel written into it (TensorFlow imported only when a test asks for it)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def root(tmp_path_factory, request):
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture(scope="module")
def toy(root):
    from . import models

    return models.save_toy(root / "toy")
