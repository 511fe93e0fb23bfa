"""Delegates: hand parts of a graph to another executor.

The interpreter offers every node to each delegate in turn (`Delegate.claims`), with the op's
name, version and registration, so a delegate can refuse versions it does not know — as the
operator-versioning guide requires. Consecutive claimed nodes form a partition; a delegate that
can only tell once it sees them whole gives nodes back (`Delegate.review`), and the rest
are regrouped. The delegate prepares each partition once (`Delegate.prepare`) and the
interpreter then runs the whole partition as a single step. Unclaimed nodes run on the
reference kernels.

Default delegates are offered the nodes the user's delegates left, as LiteRT applies
XNNPACK by default: a delegate package registers a factory with `register_default_delegate`
(kiln.delegates registers its compiled delegate), and every Interpreter whose op resolver
type allows it makes one of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..ir import Operator, Tensor
from ..rules import Decision


@dataclass(frozen=True)
class NodeInfo:
    """What a delegate is shown about one node."""

    index: int
    op: Operator
    name: str          # builtin name ("CONV_2D") or custom code
    version: int
    registration: object


@dataclass
class Partition:
    """A run of consecutive claimed nodes.

    ``inputs``: tensors read from outside the partition (constants excluded), in first-use
    order; ``outputs``: tensors produced inside and read after it (or subgraph outputs, or variable
    tensors, whose final state get_tensor reads);
    ``state_inputs``: positions in ``inputs`` of state its nodes update (their records'
    ``state_operands``, e.g. LSTM states in variable tensors).

    ``runtime``: the interpreter's side a delegate that claims resource-variable ops needs
    (kiln.ops.record.Runtime): ``runtime.variables``, the interpreter's one store of resource
    variables (kiln/runtime/variables.py: a kernel reads the values its nodes read before
    writing them with ``held(rid)`` and stores the ones they write with ``hold(rid, value)``,
    which may stay in device memory), ``runtime.resource_id(container, shared_name)`` (what
    VAR_HANDLE gives) and ``runtime.call_once(index)`` (CALL_ONCE: runs an init subgraph once
    per interpreter) and ``runtime.registration(op)`` (the registration the interpreter's op
    resolver gives an operator, e.g. one of a called subgraph; None if it has none).
    ``num_threads``: the Interpreter's ``num_threads`` (None when not given).
    """

    nodes: list[NodeInfo]
    inputs: list[Tensor]
    outputs: list[Tensor]
    state_inputs: list[int] = field(default_factory=list)
    runtime: object = None
    num_threads: int | None = None


class NodesRefused(Exception):
    """Raised by `DelegateKernel.invoke` when its backend turns nodes down only once it runs
    them (LiteRT checks some operand types in Eval, not Prepare). The interpreter runs those
    nodes on their kernels from then on, has the delegate prepare the rest of the partition
    again, and runs the partition's nodes again from the same inputs — so a kernel raises it
    before changing state the interpreter holds. ``nodes``: node indices in the subgraph."""

    def __init__(self, nodes, reason: str):
        super().__init__(reason)
        self.nodes = frozenset(int(n) for n in nodes)
        self.reason = reason


class DelegateKernel:
    """A prepared partition: computes the partition outputs from its inputs.

    As a stateful reference kernel does, it returns the new values of the partition's
    ``state_inputs`` after the outputs, and the interpreter writes them back; a kernel that
    returns the outputs alone has updated that state itself.

    ``hidden_state``: True when an invoke changes state the interpreter cannot snapshot and
    restore (resource variables a delegate keeps itself), so the interpreter never runs the
    partition speculatively (to learn output shapes after a resize).
    ``exact_outputs``: True when invoke returns arrays of the output tensors' own types, which
    the interpreter then stores without checking them: NumPy arrays, or the delegate's device
    arrays for outputs only its own kernels read (get_tensor copies any of them to NumPy).
    """

    hidden_state = False
    exact_outputs = False

    def invoke(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError


class Delegate:
    """Base class of Python delegates; override `claims` and `prepare`."""

    name = "delegate"

    def claims(self, node: NodeInfo) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def prepare(self, partition: Partition) -> DelegateKernel:  # pragma: no cover - interface
        raise NotImplementedError

    def review(self, partitions: Sequence[Partition]) -> Iterable[int]:
        """Called once this delegate's claims in a subgraph are grouped into ``partitions``
        (before any is prepared): the indices of the nodes it gives back after all, which
        the delegates after it are then offered. Called again on the regrouped partitions
        until it gives nothing back. By default it keeps everything it claimed."""
        return ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class ReportingDelegate(Delegate):
    """A delegate that says why: subclasses give `why_not` (None to claim a node, else the
    reason) and `make_kernel`. After an interpreter prepares, ``claimed`` lists (node index,
    op name, version) of the nodes taken, ``rejected`` maps refused ones to the reason,
    ``decisions`` holds every verdict as a `kiln.rules.Decision` (stage "backend", subject
    "node 3 (CONV_2D)", rule: the delegate's name), and ``kernels`` the prepared partitions."""

    def __init__(self):
        self.claimed: list[tuple[int, str, int]] = []
        self.rejected: dict[tuple[int, str, int], str] = {}
        self.decisions: list[Decision] = []
        self.kernels: list[DelegateKernel] = []

    def why_not(self, node: NodeInfo) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def make_kernel(self, partition: Partition) -> DelegateKernel:  # pragma: no cover - interface
        raise NotImplementedError

    def claims(self, node: NodeInfo) -> bool:
        reason = self.why_not(node)
        key = (node.index, node.name, node.version)
        self.decisions.append(Decision("backend", f"node {node.index} ({node.name})", self.name, reason is None,
                                       reason or ""))
        if reason is None:
            self.claimed.append(key)
            return True
        self.rejected[key] = reason
        return False

    def prepare(self, partition: Partition) -> DelegateKernel:
        kernel = self.make_kernel(partition)
        self.kernels.append(kernel)
        return kernel

    def refused_at_run(self, kernel: DelegateKernel, nodes: Sequence[NodeInfo], reason: str) -> NodesRefused:
        """For a kernel of this delegate that turns ``nodes`` down while running: record it
        (the nodes move to ``rejected``, the kernel leaves ``kernels``) and return the
        `NodesRefused` for the kernel to raise."""
        if kernel in self.kernels:
            self.kernels.remove(kernel)
        for node in nodes:
            self.give_back(node, reason)
        return NodesRefused([node.index for node in nodes], reason)

    def give_back(self, node: NodeInfo, reason: str) -> None:
        """Record that a claimed node is given back (in `review`), and why."""
        key = (node.index, node.name, node.version)
        for k in range(len(self.claimed) - 1, -1, -1):
            if self.claimed[k] == key:
                del self.claimed[k]
                break
        self.rejected[key] = reason


#: Factories of the delegates every Interpreter applies after its own ones (see module doc).
_DEFAULT_DELEGATES: list[Callable[[], Delegate | None]] = []


def register_default_delegate(factory: Callable[[], Delegate | None]) -> None:
    """Make every Interpreter (op resolver type AUTO or BUILTIN) apply ``factory()``'s delegate
    to the nodes its own delegates leave (a factory may return None: nothing to apply, e.g.
    its backend is not installed). Registering the same factory again changes nothing."""
    if not callable(factory):
        raise TypeError(f"register_default_delegate takes a callable returning a Delegate, got {factory!r}")
    if factory not in _DEFAULT_DELEGATES:
        _DEFAULT_DELEGATES.append(factory)


def default_delegates() -> list[Delegate]:
    """One new delegate from each registered default factory, in registration order."""
    made = (factory() for factory in _DEFAULT_DELEGATES)
    return [delegate for delegate in made if delegate is not None]
