"""The LiteRT delegate: builtin partitions run on LiteRT's own kernels (XNNPACK included).

kiln's interpreter is the Python runtime where a custom op is a Python function, a builtin
can be overridden for a version range and every tensor can be inspected; LiteRT is the fast
one. This delegate gives kiln LiteRT's speed for everything LiteRT would run anyway: it
claims each node whose registration is kiln's builtin one (not a Python custom op, not a
builtin the user replaced with ``add_builtin``), writes each partition as a .tflite of its
own with kiln's writer (kiln/delegates/litert_model.py) and runs it in LiteRT's interpreter
with its default XNNPACK delegate and the Interpreter's ``num_threads``. Custom ops and
overrides run in kiln between partitions.

What LiteRT can run is LiteRT's to say: once the claims are grouped (`review`), each
partition is built and allocated in LiteRT, and the nodes it refuses (an op version or a
type only kiln registers, a shape its kernels reject) are given back to kiln's own delegates
and reference kernels; so, before that, are the nodes whose operand type the op record says
LiteRT does not run (`OpDef.types`: some fail only once invoked). Tensors that cannot cross
into LiteRT (strings, resources, variants) keep their producers and readers in kiln. Resource
variables (VAR_HANDLE ... CALL_ONCE) live in one store, so LiteRT runs them only when it runs
the whole of the model's one entry subgraph; otherwise they stay with kiln's store. Variable
tensors (sequence-LSTM states) are variables in the partition model too: LiteRT updates them
in place, and the kernel hands the new values back as state, which it writes in again before
the next invoke (kiln may have reset it, or a custom op changed it).

ai-edge-litert is imported when a partition is first built, so kiln runs without it; the
default Interpreter then runs on kiln's own kernels (`default_litert_delegate` logs a
one-line hint, once).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import threading
from typing import Sequence

import numpy as np

from ..errors import KilnError, OpError, UnsupportedError
from ..format import write_model
from ..ir import Operator, Subgraph
from ..ops import states, type_refusal, unquantized_codes
from ..runtime.delegate import DelegateKernel, NodeInfo, Partition, ReportingDelegate
from ..schema import DType
from .litert_model import PartitionModel, partition_model, reachable_subgraphs

log = logging.getLogger("kiln.delegates.litert")

#: Tensor types whose values kiln and LiteRT hold differently: never a partition boundary.
_NO_CROSSING = frozenset({DType.STRING, DType.RESOURCE, DType.VARIANT, DType.INT4, DType.BFLOAT16})

_HINT = ("kiln: ai-edge-litert is not installed, so builtin ops run on kiln's own kernels "
         "(pip install ai-edge-litert for LiteRT's speed)")
_hinted = False


def litert_available() -> bool:
    """Whether ai-edge-litert can be imported (looked up without importing it)."""
    return importlib.util.find_spec("ai_edge_litert") is not None


def _litert_interpreter_class():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as exc:
        raise UnsupportedError(f"the LiteRT delegate needs ai-edge-litert (pip install ai-edge-litert): {exc}") \
            from None
    return Interpreter


def default_litert_delegate() -> "LiteRtDelegate | None":
    """The default Interpreter's LiteRT delegate; None (and a hint, logged once per process)
    when ai-edge-litert is not installed."""
    global _hinted
    if litert_available():
        return LiteRtDelegate()
    if not _hinted:
        _hinted = True
        log.warning(_HINT)
    return None


def _is_builtin_registration(reg) -> bool:
    record = getattr(reg, "record", None)
    return record is not None and reg.kernel is not None and reg.kernel is record.kernel


def _uses_resources(op: Operator) -> bool:
    return op.op_type == "CALL_ONCE" or any(
        t is not None and t.dtype == DType.RESOURCE for t in (*op.inputs, *op.outputs))


def _known_wrong(op: Operator) -> str | None:
    """Why LiteRT's kernel gives wrong results for ``op`` (None: no known fault). kiln's kernels
    run such nodes with the semantics LiteRT's kernel means."""
    codes = unquantized_codes(op)
    if codes is not None:  # LiteRT computes with a zero scale, or aborts the process (ADD, SUB, LESS ...)
        return (f"LiteRT's {op.op_type} reads {codes.dtype.name} operands as quantized, and {codes.name!r} "
                "has no quantization parameters")
    if op.op_type == "BIDIRECTIONAL_SEQUENCE_LSTM" and op.options.get("merge_outputs") \
            and not op.options.get("time_major") and op.inputs and op.inputs[0] is not None \
            and tuple(op.inputs[0].signature[:1]) != (1,):
        # lstm_eval.cc steps batch entry b's states at b * (the output's last dim), which is both
        # directions' width when merged: every entry after the first reads and writes the wrong state.
        return ("LiteRT's kernel mixes up the states of batch entries after the first when it merges "
                "batch-major outputs")
    return None


class LiteRtDelegate(ReportingDelegate):
    """Runs builtin partitions on LiteRT's interpreter (see the module doc).

    Args:
      num_threads: LiteRT's thread count; None takes the Interpreter's ``num_threads``
        (LiteRT's Python default, one thread, when that is None too).
    """

    name = "litert"

    def __init__(self, num_threads: int | None = None):
        super().__init__()
        if not litert_available():
            raise UnsupportedError("kiln.LiteRtDelegate needs ai-edge-litert (pip install ai-edge-litert)")
        if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                        or num_threads < 1):
            raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
        self.num_threads = num_threads
        self._built: dict[tuple, tuple] = {}  # (subgraph, first, last) -> (LiteRT interpreter, PartitionModel)

    # -- claims ------------------------------------------------------------------------------
    def why_not(self, node: NodeInfo) -> str | None:
        op = node.op
        if op.op_type == "CUSTOM":
            return f"custom op {node.name!r} runs in kiln"
        if not _is_builtin_registration(node.registration):
            return f"{node.name} is overridden by a Python registration"
        return _known_wrong(op) or type_refusal(op)

    def review(self, partitions: Sequence[Partition]) -> set[int]:
        """Give back what only kiln can run, then what LiteRT refuses when it builds a partition."""
        given: set[int] = set()
        for partition in partitions:
            given |= self._static_refusals(partition)
        if given:
            return given
        for partition in partitions:
            key = _key(partition)
            if key not in self._built:
                given |= self._build(partition, key)
        return given

    def _give(self, nodes: Sequence[NodeInfo], reason: str) -> set[int]:
        for node in nodes:
            self.give_back(node, reason)
        return {node.index for node in nodes}

    def _static_refusals(self, partition: Partition) -> set[int]:
        given: set[int] = set()
        runtime = partition.runtime
        subgraph = partition.nodes[0].op.subgraph
        whole_entry = _is_whole_entry(partition, subgraph)
        for node in partition.nodes:
            callees = reachable_subgraphs([node.op])
            if callees and runtime is not None:
                reason = _callee_refusal(callees, runtime)
                if reason is not None:
                    given |= self._give([node], f"{node.name} calls {reason}")
                    continue
            if not whole_entry and (_uses_resources(node.op) or any(
                    _uses_resources(op) for sg in callees for op in sg.operators)):
                given |= self._give([node], f"{node.name} uses resource variables, which LiteRT keeps apart "
                                            "from kiln's store unless it runs the whole model")
        produced_by = {id(t): node for node in partition.nodes for t in node.op.outputs if t is not None}
        for t in partition.outputs:
            if t.dtype in _NO_CROSSING and not t.is_variable:
                node = produced_by[id(t)]
                given |= self._give([node], f"its output {t.name!r} is {t.dtype.name}, which cannot leave LiteRT")
        for t in partition.inputs:
            if t.dtype in _NO_CROSSING and not t.is_variable:
                readers = [n for n in partition.nodes if any(x is t for x in n.op.inputs)]
                given |= self._give(readers, f"its input {t.name!r} is {t.dtype.name}, which cannot enter LiteRT")
        return given

    def _build(self, partition: Partition, key) -> set[int]:
        """Build the partition in LiteRT; the nodes to give back if LiteRT refuses it."""
        try:
            self._built[key] = self._litert(partition)
            return set()
        except KilnError:
            raise
        except Exception as exc:  # LiteRT's refusal: find the nodes it names
            message = str(exc).strip()
        culprits = _named_culprits(partition.nodes, message)
        if not culprits:
            culprits = self._alone_refused(partition)
        if not culprits:
            culprits = list(partition.nodes)
        first_line = message.splitlines()[0] if message else "no message"
        return self._give(culprits, f"LiteRT refused it: {first_line}")

    def _alone_refused(self, partition: Partition) -> list[NodeInfo]:
        """The nodes LiteRT refuses on their own (when its message names none)."""
        refused = []
        for node in partition.nodes:
            single = Partition([node], [t for t in node.op.inputs if t is not None and not t.is_constant],
                               [t for t in node.op.outputs if t is not None], runtime=partition.runtime,
                               num_threads=partition.num_threads)
            try:
                self._litert(single)
            except KilnError:
                raise
            except Exception:
                refused.append(node)
        return refused

    def _litert(self, partition: Partition) -> tuple:
        ops = [node.op for node in partition.nodes]
        built = partition_model(ops, partition.inputs, partition.outputs)
        return _load(built.model, self._threads(partition)), built

    def _threads(self, partition: Partition) -> int | None:
        return self.num_threads if self.num_threads is not None else partition.num_threads

    # -- kernels -----------------------------------------------------------------------------
    def make_kernel(self, partition: Partition) -> "LiteRtKernel":
        key = _key(partition)
        built = self._built.pop(key, None)
        if built is None:
            built = self._litert(partition)
        return LiteRtKernel(partition, *built, num_threads=self._threads(partition), delegate=self)


#: Partition files at least this big are handed to LiteRT as a file it memory-maps (then
#: unlinked) rather than as bytes kiln would hold: the weights stay out of anonymous memory.
MAP_FROM_FILE_BYTES = 64 << 20


_XNNPACK_LOGGED = threading.Lock()
_xnnpack_announced = False


@contextlib.contextmanager
def _without_xnnpack_banner(xnnpack: bool):
    """LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." to the process's
    stderr (file descriptor 2, below Python) the first time it makes XNNPACK's delegate; kiln's
    commands print nothing a user did not ask for, so that first construction writes stderr to
    /dev/null. Later ones print nothing anyway (LiteRT logs the line once per process)."""
    global _xnnpack_announced
    if not xnnpack or _xnnpack_announced:
        yield
        return
    with _XNNPACK_LOGGED:
        if _xnnpack_announced:
            yield
            return
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
            _xnnpack_announced = True


def _load(model, num_threads: int | None, xnnpack: bool = True):
    """A LiteRT interpreter of IR ``model`` (written by kiln's writer), tensors allocated;
    ``xnnpack=False``: LiteRT's builtin kernels alone."""
    interpreter_class = _litert_interpreter_class()
    kwargs = {"num_threads": num_threads}
    if not xnnpack:
        from ai_edge_litert.interpreter import OpResolverType

        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    data = write_model(model)
    with _without_xnnpack_banner(xnnpack):
        if len(data) < MAP_FROM_FILE_BYTES:
            interpreter = interpreter_class(model_content=data, **kwargs)
        else:
            with tempfile.NamedTemporaryFile(prefix="kiln-litert-", suffix=".tflite", delete=False) as f:
                f.write(data)
            del data
            try:
                interpreter = interpreter_class(model_path=f.name, **kwargs)
            finally:
                os.unlink(f.name)  # LiteRT's mapping keeps the pages; no file is left behind
        interpreter.allocate_tensors()
    return interpreter


def _key(partition: Partition) -> tuple:
    nodes = partition.nodes
    return id(nodes[0].op.subgraph), nodes[0].index, nodes[-1].index


def _is_whole_entry(partition: Partition, subgraph: Subgraph) -> bool:
    """The partition is all of the model's only entry point (subgraph 0, the one signature)."""
    model = subgraph.model
    if model is None or model.subgraphs[0] is not subgraph or len(partition.nodes) != len(subgraph.operators):
        return False
    return all(sig.subgraph is subgraph for sig in model.signatures) and len(model.signatures) <= 1


def _callee_refusal(callees: Sequence[Subgraph], runtime) -> str | None:
    model = callees[0].model
    for sg in callees:
        for oi, op in enumerate(sg.operators):
            reg = runtime.registration(op)
            where = model.subgraph_index(sg) if model is not None else "?"
            if op.op_type == "CUSTOM" or not _is_builtin_registration(reg):
                what = "a custom op" if op.op_type == "CUSTOM" else "a Python registration"
                return f"subgraph {where}, whose node {oi} ({op.name}) runs {what} in kiln"
            wrong = _known_wrong(op)
            if wrong is not None:
                return f"subgraph {where}, whose node {oi} ({op.name}) runs in kiln: {wrong}"
    return None


_UNREGISTERED = re.compile(r"Didn't find op for builtin opcode '([A-Z0-9_]+)' version '(\d+)'")
_PREPARE_FAILED = re.compile(r"Node number (\d+) \(([A-Za-z0-9_]+)\) failed to prepare")


def _named_culprits(nodes: Sequence[NodeInfo], message: str) -> list[NodeInfo]:
    """The partition nodes LiteRT's error message names: an op version it has no kernel for
    (in the partition or a subgraph a node calls), or the node whose prepare failed."""
    found = []
    for name, version in _UNREGISTERED.findall(message):
        version = int(version)
        for node in nodes:
            ops = [node.op] + [op for sg in reachable_subgraphs([node.op]) for op in sg.operators]
            if any(op.op_type == name and op.version == version for op in ops):
                found.append(node)
    for index, name in _PREPARE_FAILED.findall(message):
        index = int(index)
        if index < len(nodes) and nodes[index].name == name and nodes[index] not in found:
            found.append(nodes[index])
    return found


_INVOKE_FAILED = re.compile(r"Node number (\d+) \(([A-Za-z0-9_]+)\) failed to invoke")

#: Words of LiteRT's kernels turning an operand type down in Eval (they check some types only
#: there); other failures at run time (a bad index, a bad shape) are the data's, not the node's.
_TYPE_REFUSAL = re.compile(r"[Tt]ype|supported|[Uu]nsupported|not implemented", re.IGNORECASE)


def _failed_at_run(nodes: Sequence[NodeInfo], message: str) -> list[NodeInfo]:
    """The partition node whose Eval turned its operand types down (a failure the node would
    have at any input); none for failures that depend on the data."""
    if not _TYPE_REFUSAL.search(message):
        return []
    for index, name in _INVOKE_FAILED.findall(message):
        index = int(index)
        if index < len(nodes) and nodes[index].name == name:
            return [nodes[index]]
    return []


class LiteRtKernel(DelegateKernel):
    """One partition running in a LiteRT interpreter.

    Inputs are copied in (LiteRT's ``SetTensor``) and outputs copied out (``GetTensor``):
    LiteRT may move its tensors whenever it re-plans its arena (a resize, a dynamic shape),
    so no array kiln keeps may point into it.
    """

    exact_outputs = True  # GetTensor gives fresh arrays of the tensors' own types

    def __init__(self, partition: Partition, interpreter, built: PartitionModel, num_threads: int | None = None,
                 delegate: LiteRtDelegate | None = None):
        self.partition = partition
        self.num_threads = num_threads
        self.delegate = delegate
        self.interpreter = interpreter  # keeps the wrapper (and the model bytes it reads) alive
        self.model = built
        self.xnnpack = True
        self._wrapper = interpreter._interpreter
        fed = [k for k in range(len(partition.inputs)) if k not in set(built.variable_inputs)]
        self._feeds = list(zip(fed, built.inputs))
        self._shapes = [tuple(int(d) for d in self._wrapper.TensorSize(i, 0)) for i in built.inputs]
        self._outputs = list(built.outputs)
        variable_at = dict(zip(built.variable_inputs, built.variables))
        # State the nodes update (LSTM states): written in before each invoke, since a custom
        # op may have changed kiln's array in place, and read back after it.
        self._state = [(k, variable_at.get(k)) for k in partition.state_inputs]
        # Other variables: LiteRT keeps them; written in only when kiln holds another array.
        self._variables = [(k, i) for k, i in variable_at.items() if k not in set(partition.state_inputs)]
        self._synced: dict[int, object] = {}                   # input position -> array LiteRT holds
        # Resource variables and random generators (stateful records) live inside LiteRT.
        ops = [n.op for n in partition.nodes]
        ops += [op for sg in reachable_subgraphs(ops) for op in sg.operators]
        self.hidden_state = any(_uses_resources(op) or states(op.op_type, "stateful") for op in ops)

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        wrapper = self._wrapper
        if [inputs[position].shape for position, _ in self._feeds] != self._shapes:
            self._resize(inputs)
        try:
            for position, index in self._feeds:
                wrapper.SetTensor(index, inputs[position])
            if self._state or self._variables:
                self._write_state(inputs)
            wrapper.Invoke()
        except (RuntimeError, ValueError) as exc:
            return self._failed(inputs, str(exc).strip())
        try:
            results = [wrapper.GetTensor(index, 0) for index in self._outputs]
            if self._state:
                results += [None if index is None else wrapper.GetTensor(index, 0) for _, index in self._state]
        except ValueError:  # an output a node sized to nothing (WHERE of no true element, ...)
            return self._results_with_empty()
        return results

    def _results_with_empty(self) -> list:
        """The outputs when one is empty: LiteRT's GetTensor refuses a tensor of no elements
        ("Invalid tensor size"), so those are made here, of the size LiteRT gave them."""
        wrapper = self._wrapper

        def read(index: int, dtype):
            shape = tuple(int(d) for d in wrapper.TensorSize(index, 0))
            return np.empty(shape, dtype.numpy) if 0 in shape else wrapper.GetTensor(index, 0)

        results = [read(index, t.dtype) for index, t in zip(self._outputs, self.partition.outputs)]
        state = [self.partition.inputs[k] for k, _ in self._state]
        return results + [None if index is None else read(index, t.dtype) for (_, index), t in zip(self._state, state)]

    def _write_state(self, inputs: Sequence[np.ndarray]) -> None:
        wrapper = self._wrapper
        for position, index in self._state:
            if index is not None:
                wrapper.SetTensor(index, inputs[position])
        synced = self._synced
        for position, index in self._variables:
            value = inputs[position]
            if synced.get(position) is not value:
                wrapper.SetTensor(index, value)
                synced[position] = value

    def _failed(self, inputs: Sequence[np.ndarray], message: str) -> list[np.ndarray]:
        """LiteRT's invoke failed: run without XNNPACK if XNNPACK could not (LiteRT itself
        fails there: a partition of constants only, for one); hand a node that turned its
        operand types down back to the interpreter; else an OpError."""
        if self.xnnpack and "XNNPACK" in message:
            log.info("LiteRT's XNNPACK failed on a partition (%s); running it on LiteRT's builtin kernels", message)
            self._without_xnnpack()
            return self.invoke(inputs)
        culprits = _failed_at_run(self.partition.nodes, message)
        if culprits and self.delegate is not None:
            first_line = message.splitlines()[0] if message else "no message"
            raise self.delegate.refused_at_run(self, culprits, f"LiteRT refused it when run: {first_line}")
        raise OpError(f"LiteRT failed: {message} (experimental_op_resolver_type=BUILTIN_REF runs kiln's "
                      "reference kernels instead)")

    def _without_xnnpack(self) -> None:
        self.interpreter = _load(self.model.model, self.num_threads, xnnpack=False)
        self.xnnpack = False
        self._wrapper = self.interpreter._interpreter
        self._shapes = [tuple(int(d) for d in self._wrapper.TensorSize(i, 0)) for _, i in self._feeds]
        self._synced.clear()

    def _resize(self, inputs: Sequence[np.ndarray]) -> None:
        wrapper = self._wrapper
        for k, (position, index) in enumerate(self._feeds):
            shape = inputs[position].shape
            if shape != self._shapes[k]:
                wrapper.ResizeInputTensor(index, np.array(shape, np.int32), False)
        try:
            wrapper.AllocateTensors()
        except (RuntimeError, ValueError) as exc:
            self._shapes = [()] * len(self._shapes)  # make the next invoke try again
            raise OpError(f"LiteRT cannot run the partition at input shapes "
                          f"{[tuple(inputs[p].shape) for p, _ in self._feeds]}: {str(exc).strip()}") from None
        self._shapes = [tuple(int(d) for d in wrapper.TensorSize(i, 0)) for _, i in self._feeds]
