"""Delegates that ship with kiln (see kiln.runtime.delegate for the interface)."""

from .compiled import COMPILED_LOWERINGS, SUPPORTED_VERSIONS, ChainKernel, CompiledDelegate, CompiledSupport

__all__ = ["COMPILED_LOWERINGS", "SUPPORTED_VERSIONS", "ChainKernel", "CompiledDelegate", "CompiledSupport"]
