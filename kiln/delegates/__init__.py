"""Delegates that ship with kiln (see kiln.runtime.delegate for the interface).

kiln's default delegates, in the order they are offered nodes: the LiteRT delegate (builtin
partitions on LiteRT's kernels, when ai-edge-litert is installed), then the compiled delegate
(float32 nodes) and the quantized delegate (integer and hybrid nodes) for what it leaves.
Importing this package (``import kiln`` does) registers them, so every Interpreter applies
them unless told otherwise (``experimental_op_resolver_type=OpResolverType.BUILTIN_REF``).
"""

from ..runtime.delegate import register_default_delegate
from . import lowerings  # noqa: F401 - registers its lowerings in COMPILED_LOWERINGS
from .compiled import COMPILED_LOWERINGS, SUPPORTED_VERSIONS, ChainKernel, CompiledDelegate, CompiledSupport
from .litert import LiteRtDelegate, default_litert_delegate
from .quantized import QUANTIZED_LOWERINGS, QuantizedChain, QuantizedDelegate, QuantizedSupport

register_default_delegate(default_litert_delegate)  # first, as LiteRT applies XNNPACK first
register_default_delegate(CompiledDelegate)
register_default_delegate(QuantizedDelegate)   # offered the integer nodes the compiled one refuses

__all__ = ["COMPILED_LOWERINGS", "QUANTIZED_LOWERINGS", "SUPPORTED_VERSIONS", "ChainKernel", "CompiledDelegate",
           "CompiledSupport", "LiteRtDelegate", "QuantizedChain", "QuantizedDelegate", "QuantizedSupport"]
