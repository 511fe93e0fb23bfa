"""Serialise kiln's IR to a .tflite flatbuffer (schema version 3).

Constant data is 16-byte aligned as LiteRT expects and deduplicated by content. Models
whose constants would push the flatbuffer past its 2 GiB limit store the buffers after the
flatbuffer and reference them by offset/size, as LiteRT's large-model format does.
"""

from __future__ import annotations

import hashlib
import importlib

import flatbuffers
import numpy as np


def _schema_module(name: str):
    # `tflite/__init__` re-exports the classes under the module names, so fetch the modules
    # (which also hold the builder functions) from the import system directly.
    return importlib.import_module(f"tflite.{name}")


FbBuffer = _schema_module("Buffer")
FbMetadata = _schema_module("Metadata")
FbModel = _schema_module("Model")
FbOperator = _schema_module("Operator")
FbOperatorCode = _schema_module("OperatorCode")
FbQuant = _schema_module("QuantizationParameters")
FbSignatureDef = _schema_module("SignatureDef")
FbSubGraph = _schema_module("SubGraph")
FbTensor = _schema_module("Tensor")
FbTensorMap = _schema_module("TensorMap")

from ..errors import ModelError
from ..ir import Model, Operator, Subgraph, Tensor
from ..schema import BUILTIN_CODES, OPTIONS_TAGS, PLACEHOLDER_FOR_GREATER_OP_CODES, DType
from . import options as options_codec
from .runtime_version import refresh_min_runtime_version

_FLATBUFFER_LIMIT = (1 << 31) - (1 << 20)  # keep a margin under 2 GiB for the tables
_ALIGN = 16


def options_table_for(op: Operator) -> str | None:
    from .. import ops  # local: ops import nothing from format, but keep the layering explicit

    record = ops.get(op.op_type)
    if record is not None and record.options is not None:
        return record.options.table
    return op.options_table


def tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    """The raw buffer contents of a constant (or initialised variable) tensor."""
    data = tensor.data
    if tensor.dtype in (DType.STRING, DType.RESOURCE, DType.VARIANT):
        return np.ascontiguousarray(data, np.uint8).reshape(-1).data
    if tensor.dtype == DType.INT4:
        vals = np.asarray(data, np.int8).reshape(-1).astype(np.uint8) & 0x0F
        if vals.size % 2:
            vals = np.append(vals, np.uint8(0))
        return (vals[0::2] | (vals[1::2] << 4)).astype(np.uint8).tobytes()
    arr = np.ascontiguousarray(data, dtype=tensor.dtype.numpy)
    expected = tuple(tensor.shape)
    if arr.shape != expected and arr.size != int(np.prod(expected, dtype=np.int64)):
        raise ModelError(f"tensor {tensor.name!r}: data of shape {arr.shape} does not fit shape {list(expected)}")
    return arr.reshape(-1).view(np.uint8).data


class _Writer:
    def __init__(self, model: Model, external: bool, external_base: int = 0):
        self.model = model
        self.external = external
        self.external_base = external_base
        self.builder = flatbuffers.Builder(1024)
        self.buffer_data: list[bytes | memoryview | None] = [None]  # buffer 0: the empty sentinel
        self.buffer_keys: dict[tuple, int] = {}
        self.opcodes: dict[tuple, int] = {}
        self.opcode_list: list[tuple[int, str | None, int]] = []

    # -- buffers -----------------------------------------------------------------------------
    def buffer_for(self, tensor: Tensor) -> int:
        if tensor.data is None:
            return 0
        raw = tensor_bytes(tensor)
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        key = (digest, len(raw))
        if key in self.buffer_keys:
            return self.buffer_keys[key]
        self.buffer_data.append(raw)
        self.buffer_keys[key] = len(self.buffer_data) - 1
        return len(self.buffer_data) - 1

    def add_raw_buffer(self, raw: bytes) -> int:
        self.buffer_data.append(raw)
        return len(self.buffer_data) - 1

    def opcode_index(self, op: Operator) -> int:
        key = (op.op_type, op.custom_code, op.version)
        if key not in self.opcodes:
            if op.op_type not in BUILTIN_CODES:
                raise ModelError(f"unknown builtin operator {op.op_type!r}")
            self.opcodes[key] = len(self.opcode_list)
            self.opcode_list.append((BUILTIN_CODES[op.op_type], op.custom_code, op.version))
        return self.opcodes[key]

    # -- helpers -----------------------------------------------------------------------------
    def int_vector(self, start_fn, values, prepend="PrependInt32") -> int:
        b = self.builder
        start_fn(b, len(values))
        fn = getattr(b, prepend)
        for v in reversed(list(values)):
            fn(int(v))
        return b.EndVector()

    def numpy_vector(self, arr: np.ndarray) -> int:
        return self.builder.CreateNumpyVector(np.ascontiguousarray(arr))

    def bytes_vector(self, raw, alignment: int = 1) -> int:
        b = self.builder
        raw = memoryview(raw).cast("B")
        n = len(raw)
        b.StartVector(1, n, alignment)
        b.head = b.head - n
        b.Bytes[b.head:b.head + n] = raw
        return b.EndVector()

    # -- tables ------------------------------------------------------------------------------
    def write_quant(self, q) -> int:
        b = self.builder
        vecs = {}
        for name, arr in (("Min", q.min), ("Max", q.max), ("Scale", q.scale), ("ZeroPoint", q.zero_point)):
            if arr is not None and len(arr):
                vecs[name] = self.numpy_vector(np.asarray(arr, np.int64 if name == "ZeroPoint" else np.float32))
        FbQuant.Start(b)
        for name, off in vecs.items():
            getattr(FbQuant, "Add" + name)(b, off)
        if q.quantized_dimension:
            FbQuant.AddQuantizedDimension(b, q.quantized_dimension)
        return FbQuant.End(b)

    def write_tensor(self, t: Tensor) -> int:
        b = self.builder
        name = b.CreateString(t.name)
        shape = self.int_vector(FbTensor.StartShapeVector, t.shape)
        sig = self.int_vector(FbTensor.StartShapeSignatureVector, t.shape_signature) \
            if t.shape_signature is not None else None
        quant = self.write_quant(t.quantization) if t.quantization is not None and not t.quantization.is_empty else None
        buffer = self.buffer_for(t)
        FbTensor.Start(b)
        FbTensor.AddShape(b, shape)
        FbTensor.AddType(b, int(t.dtype))
        FbTensor.AddBuffer(b, buffer)
        FbTensor.AddName(b, name)
        if quant is not None:
            FbTensor.AddQuantization(b, quant)
        if t.is_variable:
            FbTensor.AddIsVariable(b, True)
        if sig is not None:
            FbTensor.AddShapeSignature(b, sig)
        if t.has_rank:
            FbTensor.AddHasRank(b, True)
        return FbTensor.End(b)

    def write_operator(self, op: Operator, index: dict[int, int]) -> int:
        b = self.builder

        def idx(t):
            return -1 if t is None else index[id(t)]

        inputs = self.int_vector(FbOperator.StartInputsVector, [idx(t) for t in op.inputs])
        outputs = self.int_vector(FbOperator.StartOutputsVector, [idx(t) for t in op.outputs])
        inter = self.int_vector(FbOperator.StartIntermediatesVector, [idx(t) for t in op.intermediates]) \
            if op.intermediates else None
        table = options_table_for(op)
        opts = None
        if table is not None and op.op_type != "CUSTOM":
            try:
                opts = options_codec.encode(b, table, op.options)
            except KeyError as exc:
                raise ModelError(f"operator {op.name}: {exc.args[0]}") from None
        elif op.options and op.op_type != "CUSTOM":
            raise ModelError(f"operator {op.name} has options {sorted(op.options)} but no options table")
        custom = self.bytes_vector(op.custom_options) if op.custom_options else None
        FbOperator.Start(b)
        FbOperator.AddOpcodeIndex(b, self.opcode_index(op))
        FbOperator.AddInputs(b, inputs)
        FbOperator.AddOutputs(b, outputs)
        if opts is not None:
            FbOperator.AddBuiltinOptionsType(b, OPTIONS_TAGS[table])
            FbOperator.AddBuiltinOptions(b, opts)
        if custom is not None:
            FbOperator.AddCustomOptions(b, custom)
            FbOperator.AddCustomOptionsFormat(b, op.custom_options_format)
        if inter is not None:
            FbOperator.AddIntermediates(b, inter)
        return FbOperator.End(b)

    def write_subgraph(self, sg: Subgraph) -> int:
        b = self.builder
        tensors = list(sg.tensors)
        known = {id(t) for t in tensors}
        for op in sg.operators:  # tolerate passes that created tensors without registering them
            for t in (*op.inputs, *op.outputs, *op.intermediates):
                if t is not None and id(t) not in known:
                    known.add(id(t))
                    tensors.append(t)
        index = {id(t): i for i, t in enumerate(tensors)}
        for t in (*sg.inputs, *sg.outputs):
            if id(t) not in index:
                raise ModelError(f"subgraph {sg.name!r}: input/output {t.name!r} is not one of its tensors")
        t_offs = [self.write_tensor(t) for t in tensors]
        op_offs = [self.write_operator(op, index) for op in sg.operators]
        FbSubGraph.StartTensorsVector(b, len(t_offs))
        for o in reversed(t_offs):
            b.PrependUOffsetTRelative(o)
        t_vec = b.EndVector()
        FbSubGraph.StartOperatorsVector(b, len(op_offs))
        for o in reversed(op_offs):
            b.PrependUOffsetTRelative(o)
        op_vec = b.EndVector()
        ins = self.int_vector(FbSubGraph.StartInputsVector, [index[id(t)] for t in sg.inputs])
        outs = self.int_vector(FbSubGraph.StartOutputsVector, [index[id(t)] for t in sg.outputs])
        name = b.CreateString(sg.name)
        FbSubGraph.Start(b)
        FbSubGraph.AddTensors(b, t_vec)
        FbSubGraph.AddInputs(b, ins)
        FbSubGraph.AddOutputs(b, outs)
        FbSubGraph.AddOperators(b, op_vec)
        FbSubGraph.AddName(b, name)
        self.tensor_indices[id(sg)] = index
        return FbSubGraph.End(b)

    def write_signature(self, sig) -> int:
        b = self.builder
        index = self.tensor_indices[id(sig.subgraph)]

        def maps(items):
            offs = []
            for name, t in items:
                n = b.CreateString(name)
                FbTensorMap.Start(b)
                FbTensorMap.AddName(b, n)
                FbTensorMap.AddTensorIndex(b, index[id(t)])
                offs.append(FbTensorMap.End(b))
            return offs

        in_offs, out_offs = maps(sig.inputs.items()), maps(sig.outputs.items())
        vecs = []
        for start, offs in ((FbSignatureDef.StartInputsVector, in_offs), (FbSignatureDef.StartOutputsVector, out_offs)):
            start(b, len(offs))
            for o in reversed(offs):
                b.PrependUOffsetTRelative(o)
            vecs.append(b.EndVector())
        key = b.CreateString(sig.key)
        FbSignatureDef.Start(b)
        FbSignatureDef.AddInputs(b, vecs[0])
        FbSignatureDef.AddOutputs(b, vecs[1])
        FbSignatureDef.AddSignatureKey(b, key)
        FbSignatureDef.AddSubgraphIndex(b, self.model.subgraph_index(sig.subgraph))
        return FbSignatureDef.End(b)

    def write(self) -> tuple[bytearray, list]:
        b = self.builder
        model = self.model
        self.tensor_indices: dict[int, dict[int, int]] = {}
        sg_offs = [self.write_subgraph(sg) for sg in model.subgraphs]
        sig_offs = [self.write_signature(s) for s in model.signatures]
        md_entries = [(name, self.add_raw_buffer(bytes(data))) for name, data in model.metadata.items()]

        # operator codes
        oc_offs = []
        for code, custom, version in self.opcode_list:
            cc = b.CreateString(custom) if custom else None
            FbOperatorCode.Start(b)
            FbOperatorCode.AddDeprecatedBuiltinCode(b, min(code, PLACEHOLDER_FOR_GREATER_OP_CODES))
            if cc is not None:
                FbOperatorCode.AddCustomCode(b, cc)
            FbOperatorCode.AddVersion(b, version)
            FbOperatorCode.AddBuiltinCode(b, code)
            oc_offs.append(FbOperatorCode.End(b))

        # buffers: inline data, or offset/size into the area after the flatbuffer
        external_spans = []
        buf_offs = []
        cursor = self.external_base
        for raw in self.buffer_data:
            data_off = None
            if raw is not None and len(raw) and not self.external:
                data_off = self.bytes_vector(raw, _ALIGN)
            FbBuffer.Start(b)
            if data_off is not None:
                FbBuffer.AddData(b, data_off)
            elif raw is not None and len(raw) and self.external:
                cursor = -(-cursor // _ALIGN) * _ALIGN
                FbBuffer.AddOffset(b, cursor)
                FbBuffer.AddSize(b, len(raw))
                external_spans.append((cursor, raw))
                cursor += len(raw)
            buf_offs.append(FbBuffer.End(b))

        md_offs = []
        for name, bi in md_entries:
            n = b.CreateString(name)
            FbMetadata.Start(b)
            FbMetadata.AddName(b, n)
            FbMetadata.AddBuffer(b, bi)
            md_offs.append(FbMetadata.End(b))

        def table_vector(start, offs):
            start(b, len(offs))
            for o in reversed(offs):
                b.PrependUOffsetTRelative(o)
            return b.EndVector()

        oc_vec = table_vector(FbModel.StartOperatorCodesVector, oc_offs)
        sg_vec = table_vector(FbModel.StartSubgraphsVector, sg_offs)
        buf_vec = table_vector(FbModel.StartBuffersVector, buf_offs)
        md_vec = table_vector(FbModel.StartMetadataVector, md_offs) if md_offs else None
        sig_vec = table_vector(FbModel.StartSignatureDefsVector, sig_offs) if sig_offs else None
        desc = b.CreateString(model.description)
        FbModel.Start(b)
        FbModel.AddVersion(b, model.version)
        FbModel.AddOperatorCodes(b, oc_vec)
        FbModel.AddSubgraphs(b, sg_vec)
        FbModel.AddDescription(b, desc)
        FbModel.AddBuffers(b, buf_vec)
        if md_vec is not None:
            FbModel.AddMetadata(b, md_vec)
        if sig_vec is not None:
            FbModel.AddSignatureDefs(b, sig_vec)
        b.Finish(FbModel.End(b), file_identifier=b"TFL3")
        return b.Output(), external_spans


def write_model(model: Model, *, external_buffers: bool | None = None) -> bytes:
    """Serialise ``model`` to .tflite bytes.

    ``external_buffers`` forces (True) or forbids (False) storing constant data after the
    flatbuffer; by default it is used only when the constants would not fit under 2 GiB.
    A ``min_runtime_version`` entry in the model's metadata is recomputed from its operators
    first (`runtime_version.refresh_min_runtime_version`).
    """
    refresh_min_runtime_version(model)
    if external_buffers is None:
        total = sum(t.data.nbytes for sg in model.subgraphs for t in sg.tensors if t.data is not None)
        external_buffers = total > _FLATBUFFER_LIMIT
    if not external_buffers:
        out, _ = _Writer(model, external=False).write()
        return bytes(out)
    # Offsets are absolute file positions, known only once the flatbuffer's size is: build with
    # a provisional base, then again with the real one (the uint64 fields keep the size fixed).
    provisional, _ = _Writer(model, external=True, external_base=1 << 40).write()
    base = -(-len(provisional) // _ALIGN) * _ALIGN
    out, spans = _Writer(model, external=True, external_base=base).write()
    if len(out) != len(provisional):
        raise ModelError("internal error: flatbuffer size changed between the two passes")
    parts = [bytes(out), b"\0" * (base - len(out))]
    pos = base
    for offset, raw in spans:
        parts.append(b"\0" * (offset - pos))
        parts.append(bytes(raw))
        pos = offset + len(raw)
    return b"".join(parts)


def save_model(model: Model, path, **kwargs) -> int:
    """Write ``model`` to ``path``; returns the number of bytes written."""
    data = write_model(model, **kwargs)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
