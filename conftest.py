"""Repository-level pytest configuration: quiet TensorFlow, make `tests` importable."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
