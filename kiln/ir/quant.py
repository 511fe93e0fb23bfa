"""Quantization parameters attached to IR tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class QuantParams:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per channel.

    `scale` and `zero_point` are 1-D arrays: one entry for per-tensor quantization, one per
    slice along `quantized_dimension` for per-channel quantization. `min`/`max` are the
    calibration ranges the converter may record (optional).
    """

    scale: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    zero_point: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    quantized_dimension: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    def __post_init__(self):
        self.scale = np.atleast_1d(np.asarray(self.scale, np.float32))
        self.zero_point = np.atleast_1d(np.asarray(self.zero_point, np.int64))
        if self.min is not None:
            self.min = np.atleast_1d(np.asarray(self.min, np.float32))
        if self.max is not None:
            self.max = np.atleast_1d(np.asarray(self.max, np.float32))

    @property
    def is_empty(self) -> bool:
        return self.scale.size == 0 and self.min is None and self.max is None

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    def __eq__(self, other):
        if not isinstance(other, QuantParams):
            return NotImplemented
        return (
            np.array_equal(self.scale, other.scale)
            and np.array_equal(self.zero_point, other.zero_point)
            and self.quantized_dimension == other.quantized_dimension
        )
