"""The IR: the one in-memory model representation shared by converter, passes and runtime."""

from .graph import Checkpoint, IRError, Model, Operator, Signature, Subgraph, Tensor
from .invariants import check_invariants
from .quant import QuantParams

__all__ = ["Checkpoint", "IRError", "Model", "Operator", "QuantParams", "Signature", "Subgraph", "Tensor", "check_invariants"]
