"""The IR: the one in-memory model representation shared by converter, passes and runtime."""

from .graph import IRError, Model, Operator, Signature, Subgraph, Tensor
from .quant import QuantParams

__all__ = ["IRError", "Model", "Operator", "QuantParams", "Signature", "Subgraph", "Tensor"]
