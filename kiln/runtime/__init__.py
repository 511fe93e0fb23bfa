"""The runtime: Interpreter, op resolvers, Python custom ops and delegates."""

from .custom import Context, Node, TensorView
from .delegate import Delegate, DelegateKernel, NodeInfo, Partition
from .interpreter import Interpreter, SignatureRunner
from .resolver import BuiltinOpResolver, MutableOpResolver, Registration

__all__ = [
    "BuiltinOpResolver", "Context", "Delegate", "DelegateKernel", "Interpreter", "MutableOpResolver",
    "Node", "NodeInfo", "Partition", "Registration", "SignatureRunner", "TensorView",
]
