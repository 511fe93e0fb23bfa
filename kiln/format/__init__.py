"""The .tflite format: validated reading into the IR and writing back out."""

from .reader import read_model
from .writer import save_model, write_model

__all__ = ["read_model", "save_model", "write_model"]
