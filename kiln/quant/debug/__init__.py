"""The quantization debugger: what a quantized model lost, op by op.

`QuantizationDebugger` (debugger.py) pairs each quantized tensor with its float twin
(match.py), runs both models with every tensor kept (run.py), and reports per-op error,
a denylist search and an HTML page (report.py).
"""

from .debugger import QuantizationDebugger

__all__ = ["QuantizationDebugger"]
