"""Composite-function fusion: the contract between the TensorFlow importer and fusion rules.

A TensorFlow function carrying ``_implements`` (``tf.function(experimental_implements=...)``,
tf_keras' ``api_implements``) reaches the importer as a call. Before inlining it, the
importer asks this registry for a fusion registered under the implements name. The fusion
receives a `CompositeCall` and either emits fused IR operators producing the call's outputs,
or raises `NotFusable` with a reason users will read ("lstm_2: not fused: ..."); the
importer then inlines the function as ordinary code and records the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import KilnError
from ..ir import Subgraph, Tensor


class NotFusable(KilnError):
    """A fusion's check failed; the message is the reason shown to users."""


@dataclass
class CompositeCall:
    """One call of a composite function, as the importer hands it to a fusion.

    Attributes:
      name: the implements name as written in the model ("embedding_lookup", "lstm_<uuid>").
      attrs: the NameAttrList attrs (and tf_keras' function attrs such as ``time_major``,
        ``go_backwards``) as plain Python values.
      inputs: IR tensors bound to the function's arguments, in argument order. Arguments fed
        by read-only variables or constants arrive as constant tensors (``tensor.data`` set).
      output_dtypes / output_shapes: what each function output must be (shape with -1 for
        unknown dims).
      subgraph: where to add the fused ops (``subgraph.add_operator`` / ``add_constant``).
      function: the TensorFlow function body (a ``tf.Graph``) for fusions that must read it.
      label: a user-facing name for diagnostics (layer or function name).
    """

    name: str
    attrs: dict[str, Any]
    inputs: list[Tensor]
    output_dtypes: list
    output_shapes: list[tuple[int, ...]]
    subgraph: Subgraph
    function: Any = None
    label: str = ""
    notes: list[str] = field(default_factory=list)


#: A fusion returns one IR tensor per function output (None for outputs nobody can use).
Fusion = Callable[[CompositeCall], list]

_EXACT: dict[str, Fusion] = {}
_PREFIX: dict[str, Fusion] = {}


def register_fusion(name: str, fusion: Fusion | None = None, *, prefix: bool = False):
    """Register ``fusion`` for implements ``name`` (or every name starting with it).

    Usable as a decorator: ``@register_fusion("my_rnn")``.
    """

    def _register(fn: Fusion) -> Fusion:
        (_PREFIX if prefix else _EXACT)[name] = fn
        return fn

    return _register(fusion) if fusion is not None else _register


def unregister_fusion(name: str) -> None:
    _EXACT.pop(name, None)
    _PREFIX.pop(name, None)


def find_fusion(name: str) -> Fusion | None:
    """The fusion for an implements name: exact match first, then the longest prefix."""
    if name in _EXACT:
        return _EXACT[name]
    best = None
    for prefix, fn in _PREFIX.items():
        if name.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, fn)
    return best[1] if best else None
