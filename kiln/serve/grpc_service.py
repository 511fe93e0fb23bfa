"""TF Serving's gRPC API: ``PredictionService`` (Predict, GetModelMetadata) and ``ModelService``
(GetModelStatus), over the same `Service` as REST (batching, metrics, deadlines, drain) and on the
same event loop (`kiln.serve.http2`: HTTP/2 by the `h2` library).

A call is admitted from its message's declared size, before the message is read: a worker holds
at most ``--max_connections`` calls (one more is UNAVAILABLE), a message over
``--max_request_bytes`` is RESOURCE_EXHAUSTED (grpc's text), and a message is counted in the
worker's memory budget (TF's "OOM when allocating ..."). Every refusal is counted in the metrics.
A small request is read, run (a cheap model on the event loop, as REST's) and answered from the
read callback; a large one is read in the thread that reads large REST bodies, its numeric tensors
left in place in the message. Errors carry TF Serving's status codes and texts; Classify,
Regress, MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import numpy as np

from . import backends, grpc_api
from .budget import CLAIM
from .http2 import GrpcServer
from .rest import _BULK, INLINE_BODY_BYTES, Plan
from .service import Service
from .status import InvalidArgument, ServeError, Unimplemented

log = logging.getLogger("kiln.serve")
PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
#: gRPC status codes by name (grpc_api's, which ModelService's status messages carry too), and the HTTP
#: status each is counted as in the metrics.
CODES = grpc_api.ERROR_CODES
HTTP_OF = {3: 400, 4: 504, 5: 404, 8: 413, 9: 400, 12: 501, 13: 500, 14: 503}


class GrpcApi:
    """The gRPC services of one worker (the application `kiln.serve.http2` serves)."""

    def __init__(self, service: Service, limits):
        self.service = service
        self.manager = service.manager
        self.metrics = service.metrics
        self.budget = service.budget
        self.limits = limits
        self.max_request_bytes = limits.max_body_bytes
        self.max_calls = limits.max_connections
        self.calls = 0  # admitted and not finished
        self.m = grpc_api.messages()
        self._specs: dict = {}  # (name, version, signature) -> the answer's ModelSpec, serialized
        unserved = {name: (_unserved(name), name.lower()) for name in ("Classify", "Regress")}
        unserved["MultiInference"] = (_unserved("MultiInference"), "other")
        self.methods = {f"/{PREDICTION_SERVICE}/{name}".encode(): entry for name, entry in {
            "Predict": (self.predict, "predict"), "GetModelMetadata": (self.metadata, "metadata"), **unserved}.items()}
        self.methods[f"/{MODEL_SERVICE}/GetModelStatus".encode()] = (self.status, "status")
        self.methods[f"/{MODEL_SERVICE}/HandleReloadConfigRequest".encode()] = \
            (_unserved("HandleReloadConfigRequest"), "other")

    def server(self) -> GrpcServer:
        return GrpcServer(self, self.limits, self.budget)

    # -- what the transport calls --------------------------------------------------------------
    def admit(self, call, head: bytes):
        """None when ``call`` (its message's size known, ``head`` its first bytes) may be read, else
        the refusal as (code, text), counted."""
        size, refusal = call.size, None
        if call.refusal:  # the connection is past a connection limit
            refusal = (14, call.refusal)
        elif self.calls >= self.max_calls:
            refusal = (14, f"the server holds its limit of {self.max_calls} gRPC calls in progress; retry later")
        elif self.service.draining:
            refusal = (14, "the server is shutting down; the request was not accepted")
        elif size > self.max_request_bytes:
            refusal = (8, f"Received message larger than max ({size} vs. {self.max_request_bytes})")
        else:
            budget = self.budget
            if size <= INLINE_BODY_BYTES and budget.bodies + budget.held + size <= budget.limit:
                budget.bodies += size  # (as REST counts a body: on the event loop, no lock)
                self.calls += 1
                return None
            try:
                budget.claim(size, f"the {call.path.rsplit(b'/', 1)[-1].decode('latin-1')[:40]}Request")
            except ServeError as exc:
                refusal = (CODES[exc.code], str(exc))
        if refusal is None:
            call.ticket = self.budget.ticket(size)
            self.calls += 1
            return None
        label = self.methods.get(call.path, (None, "other"))[1]
        self.metrics.request(self.metrics.model_label(_model_name(self.m, head)), "", label, HTTP_OF[refusal[0]], 0.0)
        return refusal

    def finished(self, call) -> None:
        self.calls -= 1
        if call.ticket is None:
            self.budget.bodies -= call.size
        else:
            self.budget.give(call.size)
            call.ticket.close()

    def handle(self, call):
        """The answer to ``call`` (its message read whole): bytes, a (code, text) error, or an awaitable of either."""
        method, label = self.methods.get(call.path, (None, "other"))
        if method is None:
            return 12, "Method not found!"
        labels = [self.metrics.model_label(""), "", label]
        try:
            result = method(call, labels)
        except ServeError as exc:
            result = (CODES.get(exc.code, 13), str(exc))
        except Exception as exc:  # a bug: answered as INTERNAL, logged, never a traceback to the client
            log.exception(f"gRPC {label} failed")
            result = (13, f"Internal: {type(exc).__name__}: {exc}")
        if result.__class__ is bytes or result.__class__ is tuple or result.__class__ is list:
            self.metrics.request(*labels, HTTP_OF[result[0]] if result.__class__ is tuple else 200,
                                 time.monotonic() - call.arrived)
            return result
        return self._later(call, labels, result)

    async def _later(self, call, labels, pending):
        status = 200
        try:
            result = await pending
        except ServeError as exc:
            result = (CODES.get(exc.code, 13), str(exc))
        except Exception as exc:  # a bug: answered as INTERNAL, logged
            log.exception(f"gRPC {labels[2]} failed")
            result = (13, f"Internal: {type(exc).__name__}: {exc}")
        if result.__class__ is tuple:
            status = HTTP_OF[result[0]]
        self.metrics.request(*labels, 499 if call.gone else status, time.monotonic() - call.arrived)
        return result

    # -- methods -------------------------------------------------------------------------------
    def _parse(self, name: str, data):
        try:
            return self.m[name].FromString(data)
        except Exception as exc:  # protobuf's DecodeError
            raise InvalidArgument(f"cannot parse the {name}: {exc}") from None

    def _acquire(self, spec, labels):
        if not spec.name:
            raise InvalidArgument("Missing ModelSpec")
        labels[0] = self.metrics.model_label(spec.name)
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        served = self.manager.acquire(spec.name, version, label)
        labels[1] = self.service.labels(spec.name, served)[1]
        return served

    def predict(self, call, labels):
        data = call.message
        if len(data) > INLINE_BODY_BYTES:  # read off the event loop
            return self._predict_large(call, labels)
        request = self._parse("PredictRequest", data)
        spec, inputs = request.model_spec, request.inputs
        if len(inputs) != 1 or spec.signature_name or request.output_filter or self.service.draining:
            return self._predict(call, labels, spec, inputs, list(request.output_filter))
        served = self._acquire(spec, labels)
        try:  # the common request: the version's `Plan` (REST's), its checks made as Service.submit makes them
            plan = served.plans.get("grpc", False)
            if plan is False:
                plan = served.plans["grpc"] = _plan(served)
            proto = inputs.get(plan[0].name) if plan is not None else None
            if proto is not None and proto.dtype == plan[1]:
                rest, number, row_bytes, shapes = plan
                content = proto.tensor_content
                rows, extra = divmod(len(content), row_bytes)
                shape = shapes.get(rows) or _shape(shapes, rows, rest)
                if content and not extra and rows <= rest.max_rows and proto.tensor_shape.SerializeToString() == shape:
                    deadline = call.arrived + self.service.timeout
                    array = np.frombuffer(content, rest.dtype).reshape((rows, *rest.inner))
                    outputs = rest.executor.run(rest.key, {rest.name: array}, rows, deadline if call.deadline
                                                is None else min(deadline, call.deadline))
                    return self._answer(outputs, (), spec.name, served.version, rest.key)
        finally:
            self.manager.release(served)
        return self._predict(call, labels, spec, inputs, [])

    async def _predict_large(self, call, labels):
        labels[0] = self.metrics.model_label(_model_name(self.m, call.message))
        spec, inputs, wanted = await asyncio.get_running_loop().run_in_executor(_BULK, grpc_api.read_predict,
                                                                                call.message)
        result = self._predict(call, labels, spec, inputs, wanted)
        return (await result) if not isinstance(result, (bytes, list, tuple)) else result

    def _predict(self, call, labels, spec, inputs, wanted):
        served = self._acquire(spec, labels)
        try:
            signature = backends.signature(served.loaded, spec.signature_name)
            feeds = {}
            token = CLAIM.set(call.ticket.claim if call.ticket is not None else None)
            try:
                for name, proto in inputs.items():
                    if name not in signature.inputs:
                        raise InvalidArgument(f"input tensor alias not found in signature: {name}. Inputs expected to "
                                              f"be in the set {{{','.join(sorted(signature.inputs))}}}.")
                    array = grpc_api.to_array(proto, name, self.max_request_bytes)
                    want = signature.inputs[name].dtype
                    if array.dtype != want and not (want.kind in "OSU" and array.dtype.kind == "O"):
                        raise InvalidArgument(f"input '{name}': Expects arg[{sorted(signature.inputs).index(name)}] "
                                              f"to be {_type_name(want)} but {_type_name(array.dtype)} is provided")
                    feeds[name] = array
            finally:
                CLAIM.reset(token)
            missing = sorted(set(signature.inputs) - set(feeds))
            if missing:
                raise InvalidArgument(f"input size does not match signature: {len(feeds)}!={len(signature.inputs)} "
                                      f"len({{{','.join(sorted(feeds))}}}) != len({{{','.join(sorted(signature.inputs))}}})."
                                      f" Missing inputs: {','.join(missing)}")
            job = self.service.submit(served, signature, feeds, call.arrived, call.deadline, call.ticket)
        except BaseException:
            self.manager.release(served)
            raise
        del feeds, inputs
        if job.done:
            self.manager.release(served)
            return self._answer(job.future.result(), wanted, spec.name, served.version, signature.key)
        return self._predict_later(call, served, job, wanted, spec.name, signature.key)

    async def _predict_later(self, call, served, job, wanted, name, key):
        try:
            def on_gone(cancel):
                call.on_gone = cancel

            outputs = await self.service.outputs(job, on_gone)
        finally:
            self.manager.release(served)
        return self._answer(outputs, wanted, name, served.version, key)

    def _answer(self, outputs: dict, wanted: list, name: str, version: int, signature_key: str):
        wanted = wanted or sorted(outputs)
        unknown = [n for n in wanted if n not in outputs]
        if unknown:
            raise InvalidArgument(f"output tensor alias not found in signature: {unknown[0]} Outputs expected to be "
                                  f"in the set {{{','.join(sorted(outputs))}}}.")
        spec = self._specs.get((name, version, signature_key))
        if spec is None:
            message = self.m["ModelSpec"](name=name, signature_name=signature_key)
            message.version.value = version
            spec = grpc_api.field(2, message.SerializeToString())
            if len(self._specs) < 1024:
                self._specs[name, version, signature_key] = spec
        pieces = grpc_api.predict_response(outputs, wanted, spec)
        return pieces if sum(map(len, pieces)) > INLINE_BODY_BYTES else b"".join(pieces)

    def metadata(self, call, labels):
        request = self._parse("GetModelMetadataRequest", call.message)
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field")
        unsupported = [f for f in fields if f != "signature_def"]
        if unsupported:
            raise InvalidArgument(f"Metadata field {unsupported[0]} is not supported")
        served = self._acquire(request.model_spec, labels)
        try:
            response = self.m["GetModelMetadataResponse"]()
            spec = response.model_spec
            spec.name, spec.version.value = request.model_spec.name, served.version
            defs = self.m["SignatureDefMap"]()
            self._signature_defs(served.loaded, defs)
            any_value = response.metadata["signature_def"]
            any_value.type_url = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
            any_value.value = defs.SerializeToString()
            return response.SerializeToString()
        finally:
            self.manager.release(served)

    def status(self, call, labels):
        request = self._parse("GetModelStatusRequest", call.message)
        spec = request.model_spec
        if not spec.name:
            raise InvalidArgument("Missing ModelSpec")
        labels[0] = self.metrics.model_label(spec.name)
        choice = spec.WhichOneof("version_choice")
        status = self.manager.status(spec.name, spec.version.value if choice == "version" else None,
                                     spec.version_label if choice == "version_label" else None)
        response = self.m["GetModelStatusResponse"]()
        for entry in status["model_version_status"]:
            out = response.model_version_status.add(version=int(entry["version"]), state=grpc_api.STATES[entry["state"]])
            out.status.error_code = grpc_api.ERROR_CODES.get(entry["status"]["error_code"], 2)
            out.status.error_message = entry["status"]["error_message"]
        return response.SerializeToString()

    def _signature_defs(self, model, out) -> None:
        if model.signature_defs is not None:  # a SavedModel's own SignatureDefs, byte for byte
            for key, data in model.signature_defs.items():
                out.signature_def[key].MergeFromString(data)
            return
        for key, sig in model.signatures.items():
            target = out.signature_def[key]
            target.method_name = sig.method_name
            for side, specs in (("inputs", sig.inputs), ("outputs", sig.outputs)):
                for name, spec in specs.items():
                    info = getattr(target, side)[name]
                    info.name = spec.tensor_name or name
                    info.dtype = grpc_api.DT_OF.get(spec.dtype, 0)
                    if spec.shape is None:
                        info.tensor_shape.unknown_rank = True
                    else:
                        for d in spec.shape:
                            info.tensor_shape.dim.add(size=int(d))


def _plan(served) -> tuple | None:
    """(REST's `Plan`, its input's DataType, bytes per row, {rows: the TensorShapeProto serialized}) of
    a served version whose plan takes little-endian numbers in ``tensor_content``."""
    plan = Plan.of(served)
    number = grpc_api.DT_OF.get(plan.dtype) if plan is not None else None
    if number is None or plan.dtype.byteorder == ">" or not all(plan.inner):
        return None
    return plan, number, plan.dtype.itemsize * math.prod(plan.inner), {}


def _shape(shapes: dict, rows: int, plan) -> bytes:
    message = grpc_api.messages()["TensorShapeProto"]()
    for size in (rows, *plan.inner):
        message.dim.add(size=size)
    if len(shapes) < 256:
        shapes[rows] = message.SerializeToString()
    return message.SerializeToString()


def _unserved(name: str):
    def method(call, labels):
        raise Unimplemented(f"kiln serve answers Predict, GetModelMetadata and GetModelStatus; {name} is not served")
    return method


def _model_name(messages: dict, data) -> str:
    """The model a request names (its ``model_spec``, field 1 of every request here, written first),
    read from the message's first bytes; "" when it is not there."""
    try:
        if data[:1] != b"\n":
            return ""
        size, at = 0, 1
        for shift in range(0, 35, 7):
            byte = data[at]
            at += 1
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
        return messages["ModelSpec"].FromString(bytes(data[at:at + size])).name
    except Exception:  # not a request of ours (or cut short): counted under "(other)"
        return ""


def _type_name(dtype) -> str:
    """TensorFlow's name of a dtype ("float", "double", "int32", "string")."""
    if dtype.kind in "OSU":
        return "string"
    return {"float32": "float", "float64": "double", "float16": "half"}.get(dtype.name, dtype.name)
