"""Compiled partitions saved next to a .tflite and loaded back without tracing (``jax.export``).

``MODEL.tflite.xla`` (a zip, by `export_model`) holds each partition program as serialized
StableHLO and a manifest of what must match to reuse it: the .tflite's SHA-256, kiln's version,
the dtype policy, the platform, per program its nodes and input shapes. Weights stay arguments,
recorded as the model tensor each is (transposed, reshaped or cast) and read from the .tflite at
load; only one no tensor gives is stored. `XlaDelegate(export=...)` compiles the programs without
tracing; an export written for anything else, or unreadable, is ignored with one warning.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import sys
import weakref
import zipfile

import numpy as np

from ..errors import KilnError

log = logging.getLogger("kiln.xla")
FORMAT = "kiln-xla-export/1"
_digests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def default_path(model_path) -> str:
    """Where the export of a .tflite goes, and where kiln.runtime.open looks for it."""
    return os.fspath(model_path) + ".xla"


def _where(kernel) -> tuple:
    """(model, subgraph index, node indices) of a kernel's partition."""
    sg = kernel.partition.nodes[0].op.subgraph
    return sg.model, sg.model.subgraph_index(sg), [info.index for info in kernel.partition.nodes]


def _identity(delegate, model) -> dict:
    """What an export must have been written for to be used by ``delegate`` on ``model``."""
    from jax._src.xla_bridge import canonicalize_platform  # "gpu" -> "cuda" / "rocm", as jax.export says

    if model not in _digests:  # a model built in memory has no bytes: nothing matches it
        _digests[model] = None if model.backing is None else hashlib.sha256(model.backing).hexdigest()
    version = sys.modules["kiln"].__version__  # the top package, always imported before kiln.xla (and above it)
    return {"format": FORMAT, "kiln": version, "model_sha256": _digests[model],
            "dtype_policy": delegate.dtype_policy or "float32", "platform": canonicalize_platform(delegate.device.platform)}


def _derive(data: np.ndarray, perm, shape, dtype) -> np.ndarray:
    value = np.transpose(data, perm).reshape(shape)
    return value if value.dtype == dtype else value.astype(dtype)


def _scale(value: np.ndarray) -> float:
    return float(np.abs(value.astype(np.float64)).sum())


class Recorder:
    """``delegate.recorder`` while `export_model` runs: keeps each partition program exported."""

    def __init__(self):
        self.programs: dict = {}  # id(kernel) -> (kernel, [manifest entry, serialized program])
        self.skipped: dict = {}   # id(kernel) -> (kernel, why)
        self.stored: dict = {}    # a weight's digest -> (zip member, array)
        self.tensors = None       # size -> [(subgraph, tensor index, data, _scale)]

    def export(self, kernel, fn, weights, wspecs, specs):
        """The function to compile: ``fn``'s exported program, or ``fn`` if it cannot be exported."""
        import jax

        if kernel.static_inputs or kernel.variables is not None:
            self.skipped[id(kernel)] = (kernel, "its programs depend on run-time values (static inputs or variables)")
            return fn
        try:
            platform = _identity(kernel.delegate, _where(kernel)[0])["platform"]
            blob = bytes(jax.export.export(jax.jit(fn), platforms=[platform])(wspecs, *specs).serialize())
        except Exception as exc:  # a host callback or custom call jax.export refuses
            self.skipped[id(kernel)] = (kernel, f"jax.export refused it: {type(exc).__name__}: {exc}")
            return fn
        entry = {"inputs": [[list(s.shape), np.dtype(s.dtype).char] for s in specs],
                 "weights": [self._source(kernel, np.asarray(w)) for w in weights]}
        self.programs.setdefault(id(kernel), (kernel, []))[1].append((entry, blob))
        return jax.export.deserialize(bytearray(blob)).call

    def _source(self, kernel, value: np.ndarray) -> dict:
        """Where a weight comes from: a model tensor, transposed / reshaped / cast; else stored."""
        if self.tensors is None:
            self.tensors = {}
            for si, sg in enumerate(_where(kernel)[0].subgraphs):
                for ti, data in ((ti, np.asarray(t.data)) for ti, t in enumerate(sg.tensors) if t.data is not None):
                    if data.dtype.kind in "fiub":
                        self.tensors.setdefault(data.size, []).append((si, ti, data, _scale(data)))
        found = {"shape": list(value.shape), "dtype": str(value.dtype)}
        for si, ti, data, scale in self.tensors.get(value.size, ()):
            if np.isclose(scale, _scale(value), rtol=1e-2):  # a quick test first (a bfloat16 cast keeps it)
                for perm in itertools.permutations(range(data.ndim)):
                    if np.array_equal(_derive(data, perm, value.shape, value.dtype), value):
                        return {**found, "tensor": [si, ti], "perm": list(perm)}
        digest = hashlib.blake2b(value.tobytes(), digest_size=16).hexdigest() + repr(found)
        self.stored.setdefault(digest, (f"weights/{len(self.stored)}.bin", value))
        return {**found, "stored": self.stored[digest][0]}

    def write(self, delegate, path: str) -> dict:
        """Write the programs of ``delegate``'s partitions to ``path``; returns the manifest."""
        live, members, parts = {id(k) for k in delegate.kernels}, {}, []
        for kernel, programs in (v for k, v in self.programs.items() if k in live):
            for entry, blob in programs:
                entry["program"] = f"programs/{len(members)}.jax"
                members[entry["program"]] = blob
            parts.append({"subgraph": _where(kernel)[1], "nodes": _where(kernel)[2], "entries": [e for e, _ in programs]})
        skipped = [{"nodes": _where(k)[2], "reason": why} for i, (k, why) in self.skipped.items() if i in live]
        if not parts:
            raise KilnError(f"kiln.xla export: no partition of the model could be exported ({skipped or 'none claimed'})")
        members.update({member: value.tobytes() for member, value in self.stored.values()})
        manifest = {**_identity(delegate, _where(delegate.kernels[0])[0]), "partitions": parts, "skipped": skipped,
                    "stored_weight_bytes": sum(a.nbytes for _, a in self.stored.values())}
        tmp = f"{path}.tmp{os.getpid()}"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1))
            for member, blob in members.items():
                z.writestr(member, blob)
        os.replace(tmp, path)
        return manifest


class ExportFile:
    """The export an `XlaDelegate` was given: read at its first partition, checked against its model."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise KilnError(f"XlaDelegate: export {self.path!r} is not a file (write one with `kiln xla-export MODEL`)")
        self._read = None  # (members, entries by (subgraph, nodes)) once read and matching, else False

    def _ignored(self, why: str):
        log.warning(f"kiln.xla: ignoring the export {self.path} ({why}): the partitions are traced as usual")
        return False

    def _load(self, delegate, model):
        try:
            with zipfile.ZipFile(self.path) as z:
                manifest = json.loads(z.read("manifest.json"))
                wrong = [f"{k} {manifest.get(k)!r}, not {v!r}" for k, v in _identity(delegate, model).items()
                         if manifest.get(k) != v]
                if wrong:
                    return self._ignored(f"written for other inputs: {'; '.join(wrong)}")
                members = {n: z.read(n) for n in z.namelist()}
            return members, {(p["subgraph"], tuple(p["nodes"])): p["entries"] for p in manifest["partitions"]}
        except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
            return self._ignored(f"cannot read it: {type(exc).__name__}: {exc}")

    def restore(self, kernel) -> int:
        """Compile the programs the export holds for ``kernel``'s partition into its cache: how many."""
        import jax
        import jax.numpy as jnp

        model, si, nodes = _where(kernel)
        if self._read is None:
            self._read = self._load(kernel.delegate, model)
        if not self._read:
            return 0
        members, partitions = self._read
        done = 0
        for entry in partitions.get((si, tuple(nodes)), ()):
            try:
                weights = []
                for w in entry["weights"]:
                    dtype = jnp.dtype(w["dtype"])
                    value = np.frombuffer(members[w["stored"]], dtype).reshape(w["shape"]) if "stored" in w else \
                        _derive(np.asarray(model.subgraphs[w["tensor"][0]].tensors[w["tensor"][1]].data), w["perm"],
                                w["shape"], dtype)
                    weights.append(kernel.delegate.device_weight(value))
                program = jax.export.deserialize(bytearray(members[entry["program"]])).call
                kernel.restore(tuple((tuple(shape), code) for shape, code in entry["inputs"]), program, weights)
                done += 1
            except Exception as exc:  # a program this jax cannot read or compile: that shape is traced instead
                log.warning(f"kiln.xla: export {self.path}: {kernel.label}, inputs {entry.get('inputs')}: cannot load "
                            f"the program ({type(exc).__name__}: {exc}); it is traced as usual")
        return done


def export_model(model, path=None, *, batch_sizes=None, dtype_policy=None, device=None, weights=None,
                 compiler_options=None) -> str:
    """Export the compiled partitions of ``model`` (a .tflite path, or its bytes with ``path``) to
    ``path`` (default `default_path`): the main subgraph run on zeros once per batch size (its
    inputs' free first dimension; the model's own shape without ``batch_sizes``). The other
    arguments are `XlaDelegate`'s; a loading delegate needs the same dtype_policy and platform.
    Returns the path written."""
    from ..format import read_model
    from ..runtime.interpreter import Interpreter
    from .delegate import XlaDelegate

    given_bytes = isinstance(model, (bytes, bytearray, memoryview))
    if given_bytes and path is None:
        raise KilnError("kiln.xla export: give the path to write when the model is given as bytes")
    ir = read_model(bytes(model) if given_bytes else model)  # a path is named in its errors
    delegate = XlaDelegate(device=device, dtype_policy=dtype_policy, weights=weights, batch_sizes=batch_sizes,
                           compiler_options=compiler_options)
    delegate.recorder = recorder = Recorder()
    interp = Interpreter(model_content=ir, experimental_delegates=[delegate])
    for size in delegate.batch_sizes or [None]:
        for d in interp.get_input_details():
            if size is not None and len(d["shape_signature"]) and d["shape_signature"][0] == -1:
                interp.resize_tensor_input(d["index"], [size, *d["shape"][1:]])
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        interp.invoke()
    path = os.fspath(default_path(model) if path is None else path)
    recorder.write(delegate, path)
    return path
