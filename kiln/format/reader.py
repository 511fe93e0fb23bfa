"""Read a .tflite flatbuffer into kiln's IR, validating everything an untrusted file controls.

Constant tensors are zero-copy NumPy views into the file (memory-mapped when read from a
path). Every index, offset, length and shape is checked before it is used, so a truncated,
corrupted or hostile file raises `ModelError` naming what is wrong and where — never an
IndexError / struct.error, never a huge allocation, never a hang.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from contextlib import contextmanager

import numpy as np
from tflite.Model import Model as _FbModel

from ..errors import ModelError
from ..ir import Model, Operator, QuantParams, Signature, Subgraph, Tensor
from ..ir.options import OptionError
from ..schema import BUILTIN_NAMES, OPTIONS_NAMES, DType
from . import options as options_codec

#: Largest rank kiln accepts (LiteRT kernels stop at 6; anything near this is hostile).
MAX_RANK = 16
#: Largest element count any single tensor may declare (2**36 ~ 64 G elements).
MAX_ELEMENTS = 1 << 36
#: Deepest nesting of control-flow subgraph calls (each level is a Python call chain).
MAX_CALL_DEPTH = 64
_LOW_LEVEL = (struct.error, IndexError, ValueError, TypeError, OverflowError, UnicodeDecodeError,
              AttributeError, KeyError)


class _Reader:
    def __init__(self, buf):
        self.buf = buf
        self.size = len(buf)
        self.where: list[str] = []

    # -- error context -----------------------------------------------------------------------
    @contextmanager
    def at(self, place: str):
        self.where.append(place)
        try:
            yield
        except ModelError:
            raise
        except _LOW_LEVEL as exc:
            needed = re.search(r"requires a buffer of at least (\d+) bytes", str(exc))  # struct's words
            if needed and int(needed.group(1)) > self.size:   # a table or vector reaches past the end
                raise ModelError(f"the file is truncated: expected at least {needed.group(1)} bytes, it has "
                                 f"{self.size} (cut off while downloading or copying?)") from None
            raise self.error(f"unreadable flatbuffer data ({type(exc).__name__}: {exc})") from None
        finally:
            self.where.pop()

    def error(self, message: str) -> ModelError:
        prefix = ", ".join(self.where)
        return ModelError(f"{prefix}: {message}" if prefix else message)

    def count(self, n: int, elem_bytes: int, what: str) -> int:
        """Check a vector length against the file size before iterating over it."""
        if n < 0 or n * elem_bytes > self.size:
            raise self.error(f"{what} declares {n} entries, more than a {self.size}-byte file can hold")
        return n

    def index(self, i: int, n: int, what: str, owner: str = "model", items: str | None = None) -> int:
        """Check an index into a list of ``n`` already read (buffers, subgraphs, tensors...)."""
        if not 0 <= i < n:
            raise self.error(f"{what} {i} out of range ({owner} has {n} {items or what + 's'})")
        return i

    # -- model -------------------------------------------------------------------------------
    def read(self) -> Model:
        if self.size < 8:
            raise ModelError(f"The model is not a valid Flatbuffer buffer: only {self.size} bytes")
        if bytes(self.buf[4:8]) != b"TFL3":
            raise ModelError(
                "The model is not a valid Flatbuffer buffer: missing the 'TFL3' file identifier "
                f"(found {bytes(self.buf[4:8])!r})")
        root = struct.unpack_from("<I", self.buf, 0)[0]
        if root + 4 > self.size:
            raise ModelError(f"The model is not a valid Flatbuffer buffer: root offset {root} is past the end")
        with self.at("model"):
            fb = _FbModel.GetRootAs(self.buf, 0)
            model = Model(description=(fb.Description() or b"").decode("utf-8", "replace"))
            model.version = fb.Version()
            self.buffers = self.read_buffers(fb)
            self.opcodes = self.read_opcodes(fb)
            n_sub = self.count(fb.SubgraphsLength(), 4, "subgraph list")
            if n_sub == 0:
                raise self.error("the model has no subgraphs")
            for si in range(n_sub):
                with self.at(f"subgraph {si}"):
                    model.add_subgraph(self.read_subgraph(fb.Subgraphs(si), si))
            self.read_signatures(fb, model)
            self.read_metadata(fb, model)
        check_subgraph_calls(model)
        return model

    def read_buffers(self, fb) -> list:
        out = []
        n = self.count(fb.BuffersLength(), 4, "buffer list")
        for bi in range(n):
            with self.at(f"buffer {bi}"):
                b = fb.Buffers(bi)
                offset, size = b.Offset(), b.Size()
                if offset > 1:
                    if offset + size > self.size:
                        raise self.error(
                            f"data at offset {offset} with size {size} runs past the end of the "
                            f"{self.size}-byte file")
                    out.append((offset, size))
                    continue
                length = b.DataLength()
                if length == 0:
                    out.append(None)
                    continue
                self.count(length, 1, "data")
                start = b._tab.Vector(b._tab.Offset(4))
                if start + length > self.size:
                    raise self.error(f"data of {length} bytes runs past the end of the file")
                out.append((start, length))
        return out

    def read_opcodes(self, fb) -> list[tuple[str, str | None, int]]:
        out = []
        n = self.count(fb.OperatorCodesLength(), 4, "operator code list")
        for i in range(n):
            with self.at(f"operator code {i}"):
                oc = fb.OperatorCodes(i)
                # The schema's rule: the real code is the larger of the two fields.
                code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
                name = BUILTIN_NAMES.get(code)
                if name is None:
                    raise self.error(f"unknown builtin operator code {code}")
                custom = oc.CustomCode()
                custom = custom.decode("utf-8", "replace") if custom is not None else None
                if name == "CUSTOM" and not custom:
                    raise self.error("custom operator without a custom_code name")
                out.append((name, custom, oc.Version()))
        return out

    def read_subgraph(self, fsg, si: int) -> Subgraph:
        name = fsg.Name()
        sg = Subgraph(name.decode("utf-8", "replace") if name else "")
        n_t = self.count(fsg.TensorsLength(), 4, "tensor list")
        for ti in range(n_t):
            with self.at(f"tensor {ti}"):
                sg.add_tensor(self.read_tensor(fsg.Tensors(ti)))
        tensors = sg.tensors

        def lookup(idx: int, what: str, optional: bool = False) -> Tensor | None:
            if optional and idx == -1:
                return None
            return tensors[self.index(idx, len(tensors), what, "subgraph", "tensors")]

        n_in = self.count(fsg.InputsLength(), 4, "input list")
        sg.inputs = [lookup(int(fsg.Inputs(i)), "input tensor") for i in range(n_in)]
        n_out = self.count(fsg.OutputsLength(), 4, "output list")
        sg.outputs = [lookup(int(fsg.Outputs(i)), "output tensor") for i in range(n_out)]
        n_ops = self.count(fsg.OperatorsLength(), 4, "operator list")
        for oi in range(n_ops):
            with self.at(f"operator {oi}"):
                fop = fsg.Operators(oi)
                idx = self.index(fop.OpcodeIndex(), len(self.opcodes), "opcode index", items="operator codes")
                op_type, custom, version = self.opcodes[idx]
                op = Operator(op_type, version=version, custom_code=custom)
                ins = [lookup(int(fop.Inputs(i)), "input tensor", optional=True)
                       for i in range(self.count(fop.InputsLength(), 4, "input list"))]
                outs = [lookup(int(fop.Outputs(i)), "output tensor", optional=True)
                        for i in range(self.count(fop.OutputsLength(), 4, "output list"))]
                for t in outs:
                    if t is not None and t.producer is not None:
                        raise self.error(f"output tensor {t.name!r} is already written by another operator")
                op.intermediates = [lookup(int(fop.Intermediates(i)), "intermediate tensor")
                                    for i in range(self.count(fop.IntermediatesLength(), 4, "intermediates"))]
                self.read_options(fop, op)
                sg.add_operator(op, ins, outs)
        return sg

    def read_options(self, fop, op: Operator) -> None:
        tag = fop.BuiltinOptionsType()
        if tag:
            table = OPTIONS_NAMES.get(tag)
            if table is None:
                raise self.error(f"unknown builtin options type {tag}")
            tab = fop.BuiltinOptions()
            if tab is not None:
                try:
                    op.options = options_codec.decode(table, tab.Bytes, tab.Pos)
                except OptionError as exc:
                    raise self.error(f"builtin options {table} do not fit {op.op_type}: {exc}") from None
                op.options_table = table
        if fop.CustomOptionsLength():
            n = self.count(fop.CustomOptionsLength(), 1, "custom options")
            start = fop._tab.Vector(fop._tab.Offset(14))
            op.custom_options = bytes(self.buf[start:start + n])
            op.custom_options_format = fop.CustomOptionsFormat()
        elif fop.LargeCustomOptionsSize():
            off, n = fop.LargeCustomOptionsOffset(), fop.LargeCustomOptionsSize()
            if off + n > self.size:
                raise self.error(f"large custom options at {off}+{n} run past the end of the file")
            op.custom_options = bytes(self.buf[off:off + n])

    def read_tensor(self, ft) -> Tensor:
        name = (ft.Name() or b"").decode("utf-8", "replace")
        type_code = ft.Type()
        try:
            dtype = DType(type_code)
        except ValueError:
            raise self.error(f"unknown tensor type {type_code}") from None
        shape = self.read_dims(ft.ShapeLength(), ft.Shape, "shape", allow_dynamic=False)
        sig = None
        if ft.ShapeSignatureLength():
            sig = self.read_dims(ft.ShapeSignatureLength(), ft.ShapeSignature, "shape_signature",
                                 allow_dynamic=True)
            if len(sig) != len(shape):
                raise self.error(f"shape_signature {list(sig)} has a different rank than shape {list(shape)}")
        elements = 1
        for d in shape:
            elements *= d
        if elements > MAX_ELEMENTS:
            raise self.error(f"shape {list(shape)} declares {elements} elements, more than kiln accepts")
        bi = self.index(ft.Buffer(), len(self.buffers), "buffer")
        data = None
        span = self.buffers[bi]
        if span is not None:
            data = self.view_data(span, dtype, shape, elements)
        quant = self.read_quant(ft.Quantization(), shape) if ft.Quantization() is not None else None
        if ft.Sparsity() is not None:
            raise self.error("sparse tensors are not supported by kiln yet")
        return Tensor(name, dtype, shape, data=data, shape_signature=sig, quantization=quant,
                      is_variable=ft.IsVariable(), has_rank=ft.HasRank())

    def read_dims(self, n, getter, what, allow_dynamic) -> tuple[int, ...]:
        if n > MAX_RANK:
            raise self.error(f"{what} has rank {n}, more than kiln accepts ({MAX_RANK})")
        dims = tuple(int(getter(i)) for i in range(n))
        low = -1 if allow_dynamic else 0
        for d in dims:
            if d < low:
                raise self.error(f"{what} {list(dims)} has a negative dimension")
        return dims

    def view_data(self, span, dtype: DType, shape, elements: int) -> np.ndarray:
        start, length = span
        if dtype in (DType.STRING, DType.RESOURCE, DType.VARIANT):
            return np.frombuffer(self.buf, np.uint8, length, start)
        if dtype == DType.INT4:
            need = (elements + 1) // 2
            if length < need:
                raise self.error(f"buffer holds {length} bytes, the int4 tensor needs {need}")
            packed = np.frombuffer(self.buf, np.uint8, need, start)
            low = (packed & 0x0F).astype(np.int8)
            high = (packed >> 4).astype(np.int8)
            vals = np.stack([low, high], axis=-1).ravel()[:elements]
            vals = np.where(vals > 7, vals - 16, vals).astype(np.int8)
            return vals.reshape(shape)
        need = elements * dtype.itemsize
        if length < need:
            raise self.error(
                f"buffer holds {length} bytes, the {dtype.name} tensor of shape {list(shape)} needs {need}")
        arr = np.frombuffer(self.buf, dtype.numpy, elements, start)
        return arr.reshape(shape)

    def read_quant(self, fq, shape) -> QuantParams | None:
        details = fq.DetailsType()
        if details:   # read as plain affine parameters, such a tensor would compute with no scales at all
            kind = {1: "custom", 2: "blockwise"}.get(details, f"type {details}")
            raise self.error(f"{kind} quantization details (QuantizationDetails) are not supported by kiln")
        scale = fq.ScaleAsNumpy() if fq.ScaleLength() else np.zeros(0, np.float32)
        zp = fq.ZeroPointAsNumpy() if fq.ZeroPointLength() else np.zeros(0, np.int64)
        qmin = fq.MinAsNumpy() if fq.MinLength() else None
        qmax = fq.MaxAsNumpy() if fq.MaxLength() else None
        if not len(scale) and qmin is None and qmax is None:
            return None
        qdim = fq.QuantizedDimension()
        if len(scale) > 1:
            if not 0 <= qdim < len(shape):
                raise self.error(f"quantized_dimension {qdim} out of range for shape {list(shape)}")
            if shape[qdim] != len(scale):
                raise self.error(
                    f"{len(scale)} per-channel scales but dimension {qdim} has size {shape[qdim]}")
        if len(zp) not in (0, len(scale)):
            raise self.error(f"{len(zp)} zero points for {len(scale)} scales")
        return QuantParams(np.array(scale), np.array(zp) if len(zp) else np.zeros(len(scale), np.int64),
                           qdim, None if qmin is None else np.array(qmin), None if qmax is None else np.array(qmax))

    def read_signatures(self, fb, model: Model) -> None:
        n = self.count(fb.SignatureDefsLength(), 4, "signature list")
        for i in range(n):
            with self.at(f"signature {i}"):
                fs = fb.SignatureDefs(i)
                si = self.index(fs.SubgraphIndex(), len(model.subgraphs), "subgraph")
                sg = model.subgraphs[si]
                key = (fs.SignatureKey() or b"").decode("utf-8", "replace")
                sig = Signature(key, sg)
                for getter, length, dest in ((fs.Inputs, fs.InputsLength(), sig.inputs),
                                             (fs.Outputs, fs.OutputsLength(), sig.outputs)):
                    for j in range(self.count(length, 4, "tensor map")):
                        tm = getter(j)
                        ti = self.index(tm.TensorIndex(), len(sg.tensors), "tensor", f"subgraph {si}")
                        dest[(tm.Name() or b"").decode("utf-8", "replace")] = sg.tensors[ti]
                model.signatures.append(sig)

    def read_metadata(self, fb, model: Model) -> None:
        n = self.count(fb.MetadataLength(), 4, "metadata list")
        for i in range(n):
            with self.at(f"metadata {i}"):
                md = fb.Metadata(i)
                bi = self.index(md.Buffer(), len(self.buffers), "buffer")
                span = self.buffers[bi]
                data = b"" if span is None else bytes(self.buf[span[0]:span[0] + span[1]])
                model.metadata[(md.Name() or b"").decode("utf-8", "replace")] = data


def check_subgraph_calls(model: Model) -> None:
    """Refuse control-flow references to missing subgraphs and cyclic subgraph calls."""
    from .. import ops  # local: the op records load after the format

    n = len(model.subgraphs)
    calls: list[list[int]] = []
    for si, sg in enumerate(model.subgraphs):
        targets = []
        for oi, op in enumerate(sg.operators):
            for field in ops.subgraph_fields(op):
                if field in op.options:
                    idx = op.options[field]
                    if not 0 <= idx < n:
                        raise ModelError(
                            f"subgraph {si}, operator {oi} ({op.name}): {field} {idx} out of range "
                            f"(model has {n} subgraphs)")
                    targets.append(idx)
        calls.append(targets)
    state = [0] * n  # 0 new, 1 on stack, 2 done
    depth = [0] * n  # longest chain of nested calls starting at each subgraph
    for start in range(n):
        if state[start]:
            continue
        stack = [(start, iter(calls[start]))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                depth[node] = 1 + max((depth[t] for t in calls[node]), default=0)
                if depth[node] > MAX_CALL_DEPTH:
                    raise ModelError(
                        f"subgraph {node} starts a chain of {depth[node]} nested subgraph calls, more than "
                        f"kiln accepts (kiln.format.reader.MAX_CALL_DEPTH = {MAX_CALL_DEPTH})")
            elif state[nxt] == 1:
                raise ModelError(f"subgraph {node} calls subgraph {nxt}, which (indirectly) calls it back: "
                                 "cyclic subgraph calls are not allowed")
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(calls[nxt])))


def read_model(source, name: str | None = None) -> Model:
    """Read a .tflite model from a path, bytes-like object or open binary file.

    A path is memory-mapped; constant tensors are read-only views into it (zero copy).
    Raises ModelError for anything malformed, prefixed with ``name`` (default: the path, when
    given one), so the error says which file.
    """
    if name is None and isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as exc:
            raise ModelError(f"cannot read model file {os.fspath(source)!r}: {exc.strerror}") from None
    elif isinstance(source, (bytes, bytearray, memoryview)):
        buf = bytes(source) if isinstance(source, memoryview) else source
    elif hasattr(source, "read"):
        buf = source.read()
    else:
        raise ModelError(f"cannot read a model from {type(source).__name__}; give a path or bytes")
    try:
        model = _Reader(buf).read()
    except ModelError as exc:
        if name is None:
            raise
        raise ModelError(f"{name}: {exc}") from None
    model.backing = buf
    return model


__all__ = ["read_model", "MAX_CALL_DEPTH", "MAX_RANK", "MAX_ELEMENTS"]
