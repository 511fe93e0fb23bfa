"""Delegates that ship with kiln (see kiln.runtime.delegate for the interface).

kiln's default delegates, in the order they are offered nodes: the LiteRT delegate (builtin
partitions on LiteRT's kernels, when ai-edge-litert is installed), then `NumpyDelegate` for
what it leaves. Importing this package (``import kiln`` does) registers them, so every
Interpreter applies them unless told otherwise
(``experimental_op_resolver_type=OpResolverType.BUILTIN_REF``). The NumPy delegate runs
float32 nodes as pre-packed NumPy chains and integer and hybrid nodes as prepared steps, bit
for bit the reference kernels' results; what it runs per (op, operand types) is its backend
table `LOWERINGS` (kiln.ops.backends).
"""

from ..runtime.delegate import register_default_delegate
from .compiled import ChainKernel, CompiledSupport
from .delegate import LOWERINGS, MixedChain, NumpyDelegate, register_float, register_quantized
from .litert import LiteRtDelegate, default_litert_delegate
from .quantized import QuantizedChain, QuantizedSupport

register_default_delegate(default_litert_delegate)  # first, as LiteRT applies XNNPACK first
register_default_delegate(NumpyDelegate)            # the nodes LiteRT leaves (or all, without it)

__all__ = ["LOWERINGS", "ChainKernel", "CompiledSupport", "LiteRtDelegate", "MixedChain", "NumpyDelegate",
           "QuantizedChain", "QuantizedSupport", "register_float", "register_quantized"]
