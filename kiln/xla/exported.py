"""Compiled partitions saved next to a .tflite and loaded back without tracing (``jax.export``).

`export_model` runs a model once per batch size through an `XlaDelegate` that saves, for each
executable it compiles, the partition's program as serialized StableHLO (``jax.export``): one
zip file, ``model.tflite.xla``, holding a manifest (what must match to reuse it: the .tflite's
SHA-256, kiln's version, the dtype policy, the platform; per partition its subgraph, node
indices and input shapes) and the programs. Weights stay arguments: each is recorded as the
model tensor it comes from (read back from the .tflite at load, transposed or cast as the
lowering did) and only a weight no tensor gives (a lowering's derived table) is stored.

An `XlaDelegate(export=...)` then builds those executables from the programs — the lowerings
are never traced — and traces as usual for any other shape. An export written for other model
bytes, another policy, platform or kiln, or one it cannot read, is ignored with one warning.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import weakref
import zipfile

import numpy as np

from ..errors import KilnError

log = logging.getLogger("kiln.xla")
FORMAT = "kiln-xla-export/1"
SUFFIX = ".xla"
_digests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _digest(model) -> str | None:
    """SHA-256 of the .tflite bytes a Model was read from (None for one built in memory)."""
    if model.backing is None:
        return None
    if model not in _digests:
        _digests[model] = hashlib.sha256(model.backing).hexdigest()
    return _digests[model]


def _platform(device) -> str:
    """jax.export's name of ``device``'s platform ("cpu", "cuda", "rocm", "tpu")."""
    from jax._src.xla_bridge import canonicalize_platform

    return canonicalize_platform(device.platform)


def _where(kernel) -> tuple:
    """(model, subgraph index, node indices) of a partition: its identity in the manifest."""
    sg = kernel.partition.nodes[0].op.subgraph
    return sg.model, sg.model.subgraph_index(sg), [info.index for info in kernel.partition.nodes]


def _identity(delegate, model) -> dict:
    from .. import __version__

    return {"format": FORMAT, "kiln": __version__, "model_sha256": _digest(model),
            "dtype_policy": delegate.dtype_policy or "float32", "platform": _platform(delegate.device)}


class Recorder:
    """Set on a delegate (``delegate.recorder``): each partition program it compiles is exported,
    and the executable is compiled from the exported program, exactly as a loader compiles it."""

    def __init__(self):
        self.programs: dict = {}  # id(kernel) -> (kernel, [(key, blob, weight sources)])
        self.skipped: dict = {}   # id(kernel) -> (kernel, reason)
        self.stored: dict = {}    # weight digest -> (member, array)
        self._tensors = None

    def export(self, kernel, fn, weights, wspecs, specs):
        """``fn``'s exported program, deserialized, to compile; ``fn`` itself if it cannot be exported."""
        import jax

        if kernel.static_inputs or kernel.variables is not None:
            self.skipped[id(kernel)] = (kernel, "its programs depend on run-time values (static inputs or variables)")
            return fn
        try:
            blob = jax.export.export(jax.jit(fn), platforms=[_platform(kernel.delegate.device)])(wspecs, *specs).serialize()
        except Exception as exc:  # a host callback or custom call jax.export refuses
            self.skipped[id(kernel)] = (kernel, f"jax.export refused it: {type(exc).__name__}: {exc}")
            return fn
        key = [[list(s.shape), np.dtype(s.dtype).char] for s in specs]
        sources = [self._source(kernel, np.asarray(w)) for w in weights]
        self.programs.setdefault(id(kernel), (kernel, []))[1].append((key, bytes(blob), sources))
        return jax.export.deserialize(blob).call

    def _source(self, kernel, value: np.ndarray) -> dict:
        """Where a weight comes from: a model tensor, transposed / reshaped / cast, else stored."""
        model = _where(kernel)[0]
        if self._tensors is None:
            self._tensors = {}
            for si, sg in enumerate(model.subgraphs):
                for ti, t in enumerate(sg.tensors):
                    if t.data is not None and np.asarray(t.data).dtype.kind in "fiub":
                        data = np.asarray(t.data)
                        self._tensors.setdefault(data.size, []).append((si, ti, data, _scale(data)))
        scale = _scale(value)
        for si, ti, data, data_scale in self._tensors.get(value.size, ()):
            if not np.isclose(data_scale, scale, rtol=1e-2):
                continue  # a quick test before trying the transposes (a bfloat16 cast keeps it within 1%)
            for perm in itertools.permutations(range(data.ndim)):
                if np.array_equal(_derive(data, perm, value.shape, value.dtype), value):
                    return {"tensor": [si, ti], "perm": list(perm), "shape": list(value.shape), "dtype": str(value.dtype)}
        digest = hashlib.blake2b(value.tobytes(), digest_size=16).hexdigest() + str(value.dtype) + str(value.shape)
        if digest not in self.stored:
            self.stored[digest] = (f"weights/{len(self.stored)}.bin", value)
        return {"stored": self.stored[digest][0], "shape": list(value.shape), "dtype": str(value.dtype)}

    def write(self, delegate, path: str) -> dict:
        """Write the export of ``delegate``'s current partitions to ``path``; returns its manifest."""
        live = {id(k) for k in delegate.kernels}
        parts, members = [], {}
        for kernel, programs in (v for k, v in self.programs.items() if k in live):
            model, si, nodes = _where(kernel)
            entries = []
            for key, blob, sources in programs:
                member = f"programs/{len(members)}.jax"
                members[member] = blob
                entries.append({"inputs": key, "program": member, "weights": sources})
            parts.append({"subgraph": si, "nodes": nodes, "entries": entries})
        skipped = [{"subgraph": _where(k)[1], "nodes": _where(k)[2], "reason": why}
                   for i, (k, why) in self.skipped.items() if i in live and i not in self.programs]
        if not parts:
            raise KilnError(f"kiln.xla export: no partition of the model could be exported ({skipped or 'XLA claimed no node'})")
        manifest = {**_identity(delegate, model), "partitions": parts, "skipped": skipped,
                    "stored_weight_bytes": sum(a.nbytes for _, a in self.stored.values())}
        tmp = f"{path}.tmp{os.getpid()}"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1))
            for member, blob in members.items():
                z.writestr(member, blob)
            for member, value in self.stored.values():
                z.writestr(member, value.tobytes())
        os.replace(tmp, path)
        return manifest


def _scale(value: np.ndarray) -> float:
    return float(np.abs(value.astype(np.float64)).sum())


def _derive(data: np.ndarray, perm, shape, dtype) -> np.ndarray:
    value = np.transpose(data, perm).reshape(shape)
    return value if value.dtype == dtype else value.astype(dtype)


class ExportFile:
    """An export an `XlaDelegate` was given: read on the first partition, checked against its model."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise KilnError(f"XlaDelegate: export {self.path!r} is not a file (write one with `kiln xla-export MODEL`)")
        self._checked = None  # (digest, partitions by (subgraph, nodes)) once read, or False: ignored

    def _entries(self, delegate, model):
        if self._checked is None:
            self._checked = False
            try:
                with zipfile.ZipFile(self.path) as z:
                    manifest = json.loads(z.read("manifest.json"))
                    wanted = _identity(delegate, model)
                    wrong = [f"{k} {manifest.get(k)!r}, not {v!r}" for k, v in wanted.items() if manifest.get(k) != v]
                    if wanted["model_sha256"] is None:
                        wrong = ["the model was not read from .tflite bytes"]
                    if wrong:
                        log.warning(f"kiln.xla: ignoring the export {self.path} (written for other inputs: "
                                    f"{'; '.join(wrong)}): the model's partitions are traced as usual")
                        return None
                    blobs = {e["program"]: z.read(e["program"]) for p in manifest["partitions"] for e in p["entries"]}
                    blobs.update({n: z.read(n) for n in z.namelist() if n.startswith("weights/")})
            except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
                log.warning(f"kiln.xla: ignoring the export {self.path}: cannot read it ({type(exc).__name__}: {exc}): "
                            "the model's partitions are traced as usual")
                return None
            self._checked = (blobs, {(p["subgraph"], tuple(p["nodes"])): p["entries"] for p in manifest["partitions"]})
        return self._checked or None

    def restore(self, kernel) -> int:
        """Put the executables the export holds for ``kernel``'s partition in its cache (compiled
        from the saved programs, no tracing): how many."""
        model, si, nodes = _where(kernel)
        found = self._entries(kernel.delegate, model)
        if found is None:
            return 0
        blobs, partitions = found
        import jax

        done = 0
        for entry in partitions.get((si, tuple(nodes)), ()):
            key = tuple((tuple(shape), code) for shape, code in entry["inputs"])
            try:
                call = jax.export.deserialize(bytearray(blobs[entry["program"]])).call
                weights = [kernel.delegate.device_weight(self._weight(model, blobs, s)) for s in entry["weights"]]
                kernel.restore(key, call, weights)
            except Exception as exc:  # a program this jax cannot read: that shape is traced instead
                log.warning(f"kiln.xla: export {self.path}: {kernel.label}, inputs {entry['inputs']}: cannot load the "
                            f"program ({type(exc).__name__}: {exc}); it is traced as usual")
                continue
            done += 1
        return done

    @staticmethod
    def _weight(model, blobs, source) -> np.ndarray:
        import jax.numpy as jnp

        dtype = jnp.dtype(source["dtype"])
        if "stored" in source:
            return np.frombuffer(blobs[source["stored"]], dtype).reshape(source["shape"])
        si, ti = source["tensor"]
        return _derive(np.asarray(model.subgraphs[si].tensors[ti].data), source["perm"], source["shape"], dtype)


def default_path(model_path) -> str:
    """Where an export of ``model_path`` goes (and is looked for): ``MODEL.tflite.xla``."""
    return os.fspath(model_path) + SUFFIX


def export_model(model, path=None, *, batch_sizes=None, dtype_policy=None, device=None, weights=None,
                 compiler_options=None) -> str:
    """Export the compiled partitions of ``model`` (a .tflite path, or its bytes with ``path``) to
    ``path`` (default ``MODEL.tflite.xla``): the main subgraph run once per batch size (its
    inputs' free first dimension; the model's own shape without ``batch_sizes``) on zeros. The
    other arguments are `XlaDelegate`'s, and a loading delegate must use the same dtype_policy
    and platform. Returns the path written."""
    from ..runtime.interpreter import Interpreter
    from .delegate import XlaDelegate

    if isinstance(model, (bytes, bytearray, memoryview)):
        if path is None:
            raise KilnError("kiln.xla export: give the path to write when the model is given as bytes")
        content = bytes(model)
    else:
        path = default_path(model) if path is None else path
        try:
            with open(model, "rb") as f:
                content = f.read()
        except OSError as exc:
            raise KilnError(f"kiln.xla export: cannot read the model {os.fspath(model)!r}: {exc.strerror}") from None
    delegate = XlaDelegate(device=device, dtype_policy=dtype_policy, weights=weights, batch_sizes=batch_sizes,
                           compiler_options=compiler_options)
    delegate.recorder = recorder = Recorder()
    interp = Interpreter(model_content=content, experimental_delegates=[delegate])
    details = interp.get_input_details()
    for size in delegate.batch_sizes or [None]:
        for d in details:
            if size is not None and len(d["shape_signature"]) and d["shape_signature"][0] == -1:
                interp.resize_tensor_input(d["index"], [size, *d["shape"][1:]])
        interp.allocate_tensors()
        for d in interp.get_input_details():
            interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        interp.invoke()
    recorder.write(delegate, os.fspath(path))
    return os.fspath(path)


def summary(path) -> list[str]:
    """Lines describing an export (``kiln xla-export`` prints them)."""
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        size = sum(i.compress_size for i in z.infolist())
    lines = [f"{path}: {size / 1e6:.2f} MB, {manifest['platform']}, dtype_policy {manifest['dtype_policy']}, "
             f"weights stored {manifest['stored_weight_bytes'] / 1e6:.2f} MB (the rest are read from the model)"]
    for p in manifest["partitions"]:
        shapes = ", ".join(str([s for s, _ in e["inputs"]]) for e in p["entries"])
        lines.append(f"  subgraph {p['subgraph']} nodes {p['nodes'][0]}..{p['nodes'][-1]}: inputs {shapes}")
    lines += [f"  subgraph {s['subgraph']} nodes {s['nodes'][0]}..{s['nodes'][-1]}: not exported, {s['reason']}"
              for s in manifest["skipped"]]
    return lines
