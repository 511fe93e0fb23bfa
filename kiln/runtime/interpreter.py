"""The kiln Interpreter: runs any .tflite model with the tf.lite.Interpreter API.

The API layer: loading, inputs and outputs, resizing, signatures, variables. Each subgraph
runs in its own environment (kiln/runtime/environment.py), which plans the steps, frees
values after their last use and names the node in every failure.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import InterpreterError, InterpreterStateError
from ..format import read_model
from ..ir import Model
from ..schema import DType
from .delegate import default_delegates
from .details import tensor_details
from .environment import ProfileEvent, _Runtime, _SubgraphEnv  # noqa: F401 (ProfileEvent re-exported)
from .resolver import BuiltinOpResolver, MutableOpResolver, OpResolverType


class _BlasThreads:
    """Caps the BLAS libraries NumPy uses at ``n`` threads while an invoke runs.

    Only built when threadpoolctl is importable (kiln does not depend on it). The limit is
    set, and afterwards restored, only where a library's current count differs, so an invoke
    pays a few microseconds for it.
    """

    _controllers = None  # the BLAS libraries threadpoolctl found (looked up once per process)

    def __init__(self, n: int):
        self.n = n
        self._restore: list[list] = []  # per (possibly nested) entry: (library, previous count)

    @classmethod
    def for_threads(cls, num_threads) -> "_BlasThreads | None":
        if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)) \
                or num_threads < 1:
            return None
        if cls._controllers is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                cls._controllers = ()
            else:
                cls._controllers = tuple(ThreadpoolController().select(user_api="blas").lib_controllers)
        return cls(int(num_threads)) if cls._controllers else None

    def __enter__(self):
        changed = []
        for lib in self._controllers:
            current = lib.get_num_threads()
            if current != self.n:
                lib.set_num_threads(self.n)
                changed.append((lib, current))
        self._restore.append(changed)

    def __exit__(self, *exc_info):
        for lib, previous in reversed(self._restore.pop()):
            lib.set_num_threads(previous)


class Interpreter:
    """Runs a .tflite model; the API of ``tf.lite.Interpreter`` / ``ai_edge_litert``.

    Args:
      model_path / model_content: the model (exactly one).
      op_resolver: a `MutableOpResolver` (default: `BuiltinOpResolver`, every builtin).
      custom_op_registerers: Python callables, each called with the op resolver to add ops.
      experimental_delegates: `Delegate` objects offered every node, in order.
      experimental_op_resolver_type: an `OpResolverType`. AUTO / BUILTIN (the default) also
        apply the default delegates to the nodes the given delegates leave, as LiteRT applies
        XNNPACK: LiteRT's own kernels for builtin partitions (`kiln.LiteRtDelegate`, with
        ai-edge-litert installed), then kiln's compiled and quantized delegates;
        BUILTIN_REF and BUILTIN_WITHOUT_DEFAULT_DELEGATES run the NumPy reference kernels
        alone (ai_edge_litert's members are accepted too). docs/runtime_backends.md.
      num_threads: None or an int >= 1 (LiteRT's check: -1 and 0 are refused). When
        threadpoolctl is installed, invokes cap NumPy's BLAS at this many
        threads (on a small or busy machine a multithreaded BLAS makes small matrix products
        slower); otherwise accepted for compatibility only.
      experimental_preserve_all_tensors: keep intermediates so get_tensor can read them (no
        default delegate then: a delegate keeps a partition's intermediates to itself).
      LiteRT's other keyword arguments (delegate clustering and fusion flags...) are
      accepted and change nothing; an unknown one is a TypeError, so a typo
      such as ``num_thread=4`` is not silently ignored.
    """

    def __init__(self, model_path=None, model_content=None, experimental_delegates=None, num_threads=None,
                 experimental_op_resolver_type=None, experimental_preserve_all_tensors=False,
                 op_resolver: MutableOpResolver | None = None, custom_op_registerers=None, *,
                 experimental_disable_delegate_clustering=False,
                 experimental_default_delegate_latest_features=False,
                 experimental_compress_quantization_zero_points=False,
                 experimental_disable_delegate_node_fusion=False,
                 experimental_force_delegate_node_profiling=False):
        if model_path is None and model_content is None:
            raise InterpreterError("`model_path` or `model_content` must be specified.")
        if model_path is not None and model_content is not None:
            raise InterpreterError("Can't both provide `model_path` and `model_content`")
        source = os.fspath(model_path) if model_path is not None else model_content
        self._model: Model = source if isinstance(source, Model) else read_model(source)
        self._resolver = op_resolver if op_resolver is not None else BuiltinOpResolver()
        for registerer in custom_op_registerers or ():
            if not callable(registerer):  # LiteRT also takes names of C functions; kiln cannot load those
                raise InterpreterError(
                    f"custom_op_registerers: {registerer!r} is not callable; kiln takes Python functions "
                    "that add ops to the resolver they are given (e.g. resolver.add_custom(...))")
            registerer(self._resolver)
        self._resolver_type = OpResolverType.of(experimental_op_resolver_type)
        if num_threads is not None:  # LiteRT's checks and words
            if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)):
                raise InterpreterError(f"type of num_threads should be int, got {type(num_threads).__name__}")
            if num_threads < 1:
                raise InterpreterError(f"num_threads should >= 1, got {num_threads}")
        self._delegates = list(experimental_delegates or [])
        if self._resolver_type.applies_default_delegates and not experimental_preserve_all_tensors:
            self._delegates += default_delegates()
        self._num_threads = num_threads
        self._blas_threads = _BlasThreads.for_threads(num_threads)
        self._preserve_all = bool(experimental_preserve_all_tensors)
        self._runtime = _Runtime(self)
        self._envs: dict[int, _SubgraphEnv] = {}
        self._allocated = False
        #: Optional callable receiving a `ProfileEvent` after every executed step (None: off).
        self.profiler = None

    # -- internals ---------------------------------------------------------------------------
    def _env(self, index: int = 0) -> _SubgraphEnv:
        if index not in self._envs:
            if not 0 <= index < len(self._model.subgraphs):
                raise InterpreterError(f"Invalid subgraph index {index}: the model has "
                                       f"{len(self._model.subgraphs)} subgraphs")
            self._envs[index] = _SubgraphEnv(self, index)
        return self._envs[index]

    def _check_index(self, env: _SubgraphEnv, index: int) -> int:
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(env.tensors):
            raise InterpreterError(f"Invalid tensor index {index} exceeds max tensor index "
                                   f"{len(env.tensors) - 1}")
        return int(index)

    def _ensure_allocated(self) -> None:
        if not self._allocated:
            raise InterpreterStateError("Invoke called on model that is not ready (call allocate_tensors() first).")

    # -- the tf.lite.Interpreter API ---------------------------------------------------------
    def allocate_tensors(self) -> None:
        env = self._env(0)
        env.allocate_inputs()
        env.prepare()
        for sig in self._model.signatures:
            idx = self._model.subgraph_index(sig.subgraph)
            self._env(idx).allocate_inputs()
        if env.shapes_stale:
            env.refresh_shapes()
            self._runtime.random_streams.clear()  # LiteRT's Prepare restarts random generators
        self._allocated = True

    def invoke(self) -> None:
        self._ensure_allocated()
        if self._blas_threads is None:
            self._env(0).run()
        else:
            with self._blas_threads:
                self._env(0).run()

    def get_input_details(self) -> list[dict]:
        env = self._env(0)
        return [tensor_details(env, i) for i in env.inputs]

    def get_output_details(self) -> list[dict]:
        env = self._env(0)
        return [tensor_details(env, i) for i in env.outputs]

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict]:
        env = self._env(subgraph_index)
        return [tensor_details(env, i) for i in range(len(env.tensors))]

    def _get_op_details(self, op_index: int) -> dict:
        """LiteRT's details of node ``op_index`` of subgraph 0 (types of present operands only)."""
        env = self._env(0)
        if isinstance(op_index, bool) or not isinstance(op_index, (int, np.integer)) \
                or not 0 <= op_index < len(env.sg.operators):
            raise InterpreterError(f"Invalid node index {op_index}: subgraph 0 has {len(env.sg.operators)} nodes")
        op = env.sg.operators[op_index]
        ins = [-1 if t is None else env.pos[id(t)] for t in op.inputs]
        outs = [-1 if t is None else env.pos[id(t)] for t in op.outputs]
        return {
            "index": int(op_index), "op_name": op.name, "version": op.version,
            "inputs": np.array(ins, np.int32), "outputs": np.array(outs, np.int32),
            "operand_types": [env.tensors[i].dtype.numpy.type for i in ins if i >= 0],
            "result_types": [env.tensors[i].dtype.numpy.type for i in outs if i >= 0],
        }

    def _get_ops_details(self) -> list[dict]:
        return [self._get_op_details(i) for i in range(len(self._env(0).sg.operators))]

    def set_tensor(self, tensor_index: int, value, subgraph_index: int = 0) -> None:
        self._set_tensor(tensor_index, value, subgraph_index, self._allocated or subgraph_index != 0)

    def _set_tensor(self, tensor_index: int, value, subgraph_index: int, allocated: bool) -> None:
        """set_tensor's checks in LiteRT's order (type, rank, dims, then allocation) and the copy."""
        env = self._env(subgraph_index)
        i = self._check_index(env, tensor_index)
        t = env.tensors[i]
        arr = np.asarray(value)
        if arr.shape != env.shapes[i] or (t.dtype != DType.STRING and arr.dtype != t.dtype.numpy):
            self._refuse_value(env, i, t, arr)
        if not allocated:
            raise InterpreterError("Cannot set tensor: Tensor is unallocated. Try calling allocate_tensors() first")
        env.values[i] = np.array(arr, dtype=t.dtype.numpy if t.dtype != DType.STRING else arr.dtype, copy=True)

    @staticmethod
    def _refuse_value(env, i: int, t, arr: np.ndarray) -> None:
        """set_tensor's errors (LiteRT's wording) for a value of the wrong type or shape."""
        role = f"input {env.inputs.index(i)}" if i in env.inputs else f"tensor {i}"
        if t.dtype != DType.STRING and arr.dtype != t.dtype.numpy:
            got = DType.from_numpy(arr.dtype).name if arr.dtype.kind not in "USO" else "STRING"
            raise InterpreterError(f"Cannot set tensor: Got value of type {got} but expected type "
                                   f"{t.dtype.name} for {role}, name: {t.name} ")
        expected = env.shapes[i]
        if arr.ndim != len(expected):
            raise InterpreterError(f"Cannot set tensor: Dimension mismatch. Got {arr.ndim} but expected "
                                   f"{len(expected)} for {role}.")
        for d, (got, want) in enumerate(zip(arr.shape, expected)):
            if got != want:
                raise InterpreterError(f"Cannot set tensor: Dimension mismatch. Got {got} but expected "
                                       f"{want} for dimension {d} of {role}.")

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        env = self._env(subgraph_index)
        i = self._check_index(env, tensor_index)
        value = env.values[i]
        if value is None:
            t = env.tensors[i]
            if env.steps is not None and not self._preserve_all and i not in env.outputs and i not in env.inputs:
                step = env.delegated_step_producing(i)
                if step is not None and i not in step.outs:
                    raise InterpreterError(
                        f"tensor {i} ({t.name!r}) is an intermediate of nodes {step.index}.."
                        f"{step.index + len(step.op_names) - 1}, which the {step.delegate} delegate runs and "
                        "keeps to itself (as LiteRT's XNNPACK does); create the Interpreter with "
                        "experimental_preserve_all_tensors=True (kiln's reference kernels, every tensor kept) "
                        "to read it")
                raise InterpreterError(
                    f"tensor {i} ({t.name!r}) is an intermediate that was freed after its last use; "
                    "create the Interpreter with experimental_preserve_all_tensors=True to read it")
            return np.zeros(env.shapes[i], dtype=t.dtype.numpy)
        return np.array(value, copy=True)

    def tensor(self, tensor_index: int, subgraph_index: int = 0):
        """A callable returning a view of the tensor's current buffer (no copy)."""
        env = self._env(subgraph_index)
        i = self._check_index(env, tensor_index)

        def view() -> np.ndarray:
            if env.values[i] is None:
                env.values[i] = np.zeros(env.shapes[i], dtype=env.tensors[i].dtype.numpy)
            return env.values[i]

        return view

    def resize_tensor_input(self, input_index: int, tensor_size, strict: bool = False,
                            subgraph_index: int = 0) -> None:
        env = self._env(subgraph_index)
        i = self._check_index(env, input_index)
        if i not in env.inputs:
            raise InterpreterError(f"tensor {i} ({env.tensors[i].name!r}) is not an input of subgraph "
                                   f"{subgraph_index}; only inputs can be resized")
        new = tuple(int(d) for d in np.asarray(tensor_size).reshape(-1))
        t = env.tensors[i]
        if any(d < 0 for d in new):
            raise InterpreterError(f"Cannot resize input {t.name!r} to {list(new)}: negative dimension")
        if strict:
            sig = t.signature
            if len(new) != len(sig) or any(s != -1 and s != d for s, d in zip(sig, new)):
                raise InterpreterError(
                    f"ResizeInputTensorStrict only allows mutating unknown dimensions identified by -1 "
                    f"(input {t.name!r} has signature {list(sig)}, asked for {list(new)})")
        env.check_allocation(i, new, t.dtype.numpy)
        if env.shapes[i] != new:
            env.shapes[i] = new
            env.values[i] = None
            env.shapes_stale = True
            self._allocated = False

    def get_signature_list(self) -> dict:
        # LiteRT lists each signature's names sorted, whatever order the file stores them in.
        return {s.key: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)} for s in self._model.signatures}

    def _get_full_signature_list(self) -> dict:
        """``{key: {"inputs": {name: tensor index}, "outputs": {...}}}``, as LiteRT gives it (names
        sorted; indices within the signature's subgraph)."""
        out = {}
        for s in self._model.signatures:
            pos = s.subgraph.tensor_index()
            out[s.key] = {kind: {name: pos[id(t)] for name, t in sorted(items.items())}
                          for kind, items in (("inputs", s.inputs), ("outputs", s.outputs))}
        return out

    def get_signature_runner(self, signature_key: str | None = None) -> "SignatureRunner":
        sigs = self._model.signatures
        if signature_key is None:
            if len(sigs) != 1:
                raise InterpreterError(
                    "SignatureDef signature_key is None and model has {0} Signatures. None is only allowed "
                    "when the model has 1 SignatureDef".format(len(sigs)))
            return SignatureRunner(self, sigs[0])
        for s in sigs:
            if s.key == signature_key:
                return SignatureRunner(self, s)
        raise InterpreterError(f"SignatureDef signature_key is {signature_key!r} but the model has no such "
                               f"signature (has: {[s.key for s in sigs]})")

    def reset_all_variables(self) -> None:
        """Reset variable tensors (e.g. sequence-LSTM states) to their initial values.

        As in LiteRT, resource variables (VAR_HANDLE / ASSIGN_VARIABLE) keep their values.
        """
        for env in self._envs.values():
            env.reset_variables()

    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    @property
    def model(self) -> Model:
        """The loaded model's IR (read-only use)."""
        return self._model

    def __del__(self):
        for env in getattr(self, "_envs", {}).values():
            env.free_custom_ops()


class SignatureRunner:
    """Calls one signature by its input/output names (``runner(x=...)`` -> {name: array})."""

    def __init__(self, interpreter: Interpreter, signature):
        self._interp = interpreter
        self._sig = signature
        self._sg_index = interpreter._model.subgraph_index(signature.subgraph)
        self._env = interpreter._env(self._sg_index)

    def get_input_details(self) -> dict:
        """``{signature input name: details}``; each details' "name" is the tensor's, as in LiteRT."""
        return {name: tensor_details(self._env, self._env.pos[id(t)]) for name, t in self._sig.inputs.items()}

    def get_output_details(self) -> dict:
        return {name: tensor_details(self._env, self._env.pos[id(t)]) for name, t in self._sig.outputs.items()}

    def __call__(self, **kwargs) -> dict[str, np.ndarray]:
        env = self._env
        missing = [n for n in self._sig.inputs if n not in kwargs]
        unknown = [n for n in kwargs if n not in self._sig.inputs]
        if unknown:
            raise InterpreterError(f"Invalid Input name ({unknown[0]}) for SignatureDef {self._sig.key!r}; "
                                   f"inputs are {list(self._sig.inputs)}")
        if missing:
            raise InterpreterError(f"Missing input(s) {missing} for SignatureDef {self._sig.key!r}")
        for name, value in kwargs.items():
            i = env.pos[id(self._sig.inputs[name])]
            arr = np.asarray(value)
            if tuple(arr.shape) != env.shapes[i]:
                self._interp.resize_tensor_input(i, arr.shape, subgraph_index=self._sg_index)
        env.allocate_inputs()
        env.prepare()
        for name, value in kwargs.items():
            self._interp._set_tensor(env.pos[id(self._sig.inputs[name])], np.asarray(value), self._sg_index, True)
        limit = self._interp._blas_threads
        if limit is None:
            env.run()
        else:
            with limit:
                env.run()
        return {name: np.array(env.values[env.pos[id(t)]], copy=True) for name, t in self._sig.outputs.items()}
