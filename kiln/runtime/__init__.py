"""The runtime: Interpreter, op resolvers, Python custom ops and delegates."""

from .custom import Context, Node, TensorView
from .delegate import Delegate, DelegateKernel, NodeInfo, NodesRefused, Partition, register_default_delegate
from .interpreter import Interpreter, SignatureRunner
from .resolver import BuiltinOpResolver, MutableOpResolver, OpResolverType, Registration

__all__ = [
    "BuiltinOpResolver", "Context", "Delegate", "DelegateKernel", "Interpreter", "MutableOpResolver",
    "Node", "NodeInfo", "NodesRefused", "OpResolverType", "Partition", "Registration", "SignatureRunner", "TensorView",
    "register_default_delegate",
]
