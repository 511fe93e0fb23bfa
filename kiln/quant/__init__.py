"""Post-training quantization: LiteRT's integer arithmetic and TensorFlow's parameter rules.

`arith` holds the fixed-point primitives of LiteRT's integer kernels (bit-exact with its
reference kernels); `params` derives scales and zero points the way TensorFlow's converter
does, from calibration ranges and from weights.
"""

from .api import MODES, quantize

__all__ = ["MODES", "quantize"]
