"""Delegates that ship with kiln (see kiln.runtime.delegate for the interface).

`NumpyDelegate` is kiln's default delegate: importing this package (``import kiln`` does)
registers it, so every Interpreter applies it unless told otherwise
(``experimental_op_resolver_type=OpResolverType.BUILTIN_REF``). It runs float32 nodes as
pre-packed NumPy chains and integer and hybrid nodes as prepared steps, bit for bit the
reference kernels' results; what it runs per (op, operand types) is its backend table
`LOWERINGS` (kiln.ops.backends).
"""

from ..runtime.delegate import register_default_delegate
from .compiled import ChainKernel, CompiledSupport
from .delegate import LOWERINGS, MixedChain, NumpyDelegate, register_float, register_quantized
from .quantized import QuantizedChain, QuantizedSupport

register_default_delegate(NumpyDelegate)

__all__ = ["LOWERINGS", "ChainKernel", "CompiledSupport", "MixedChain", "NumpyDelegate", "QuantizedChain",
           "QuantizedSupport", "register_float", "register_quantized"]
