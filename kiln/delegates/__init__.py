"""Delegates that ship with kiln (see kiln.runtime.delegate for the interface)."""

from .compiled import SUPPORTED_VERSIONS, ChainKernel, CompiledDelegate

__all__ = ["SUPPORTED_VERSIONS", "ChainKernel", "CompiledDelegate"]
