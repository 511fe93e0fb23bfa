"""The runtime: Interpreter, op resolvers, Python custom ops, delegates, and `open` (a model's
signatures and per-thread runners on any backend; not in ``__all__``, it would shadow the builtin)."""

from .custom import Context, Node, TensorView
from .delegate import Delegate, DelegateKernel, NodeInfo, NodesRefused, Partition, register_default_delegate
from .interpreter import Interpreter, SignatureRunner
from .resolver import BuiltinOpResolver, MutableOpResolver, OpResolverType, Registration
from .served import (  # noqa: A004 - kiln.runtime.open
    Runner, ServedModel, Signature, SignatureNotFound, TensorSpec, open, register_backend)

__all__ = [
    "BuiltinOpResolver", "Context", "Delegate", "DelegateKernel", "Interpreter", "MutableOpResolver",
    "Node", "NodeInfo", "NodesRefused", "OpResolverType", "Partition", "Registration", "Runner", "ServedModel",
    "Signature", "SignatureNotFound", "SignatureRunner", "TensorSpec", "TensorView",
    "register_backend", "register_default_delegate",
]
