"""TF Serving's gRPC API: ``PredictionService`` (Predict, GetModelMetadata) and ``ModelService``
(GetModelStatus), over the same `Service` as REST (batching, metrics, deadlines, drain).

Requests are parsed in the handler, so a malformed one is INVALID_ARGUMENT, not gRPC's
INTERNAL "Exception deserializing request". Errors carry TF Serving's status codes. Other
methods of the two services (Classify, Regress, MultiInference, HandleReloadConfigRequest)
answer UNIMPLEMENTED. Calls queue for the handler threads as REST requests queue for the event
loop; a worker past ``--max_connections`` calls (waiting or running) answers UNAVAILABLE at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import functools
import logging
import threading
import time

import grpc

from . import backends, grpc_api
from .budget import CLAIM
from .service import Service
from .status import InvalidArgument, ServeError, Unimplemented

log = logging.getLogger("kiln.serve")
PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


#: When the current gRPC call arrived (set as grpc hands it over, before it waits for a thread).
_ARRIVED: contextvars.ContextVar = contextvars.ContextVar("kiln_grpc_arrived", default=None)


class _Pool(cf.ThreadPoolExecutor):
    """The handler threads; ``pending`` counts the calls handed to them and not finished (waiting or
    running), whether or not their handler ran (a call cancelled while it waited never runs it)."""

    def __init__(self, threads: int):
        super().__init__(max_workers=threads, thread_name_prefix="kiln-grpc")
        self.pending = 0
        self._count = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):
        future = super().submit(fn, *args, **kwargs)
        with self._count:
            self.pending += 1
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future) -> None:
        with self._count:
            self.pending -= 1


class _Admission(grpc.GenericRpcHandler):
    """Admits a call as REST admits a connection's request: up to ``limit`` calls per worker wait
    for or hold a handler thread; one more is answered UNAVAILABLE at once (from a thread of its
    own, not behind the queue) and counted. Notes each call's arrival for its deadline."""

    def __init__(self, handlers: dict, refusals: dict, pool: _Pool, limit: int):
        self.handlers, self.refusals, self.pool, self.limit = handlers, refusals, pool, limit

    def service(self, details):
        method = details.method
        if self.pool.pending >= self.limit:
            return self.refusals.get(method)
        _ARRIVED.set(time.monotonic())
        return self.handlers.get(method)


class GrpcApi:
    """The gRPC services of one worker."""

    def __init__(self, service: Service, limits):
        self.service = service
        self.manager = service.manager
        self.metrics = service.metrics
        self.max_request_bytes = limits.max_body_bytes
        self.max_calls = limits.max_connections
        self.m = grpc_api.messages()

    def server(self, host: str, port: int, threads: int) -> grpc.Server:
        """A started gRPC server on ``host:port`` (shared with sibling workers: SO_REUSEPORT)."""
        options = [("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", self.max_request_bytes),
                   ("grpc.max_send_message_length", -1)]
        pool = _Pool(threads)
        server = grpc.server(pool, options=options)
        predictions = {"Predict": (self.predict, "predict"), "GetModelMetadata": (self.metadata, "metadata"),
                       "Classify": (_unserved("Classify"), "classify"), "Regress": (_unserved("Regress"), "regress"),
                       "MultiInference": (_unserved("MultiInference"), "other")}
        models = {"GetModelStatus": (self.status, "status"),
                  "HandleReloadConfigRequest": (_unserved("HandleReloadConfigRequest"), "other")}
        handlers, refusals = {}, {}
        refusing = cf.ThreadPoolExecutor(1, thread_name_prefix="kiln-grpc-refuse")
        for service_name, table in ((PREDICTION_SERVICE, predictions), (MODEL_SERVICE, models)):
            for name, (method, label) in table.items():
                path = f"/{service_name}/{name}"
                handlers[path] = grpc.unary_unary_rpc_method_handler(self._call(method, label))
                refuse = functools.partial(self._refuse, label)
                refuse.experimental_thread_pool = refusing  # (grpc's hook: answered without waiting for the queue)
                refusals[path] = grpc.unary_unary_rpc_method_handler(refuse)
        server.add_generic_rpc_handlers([_Admission(handlers, refusals, pool, self.max_calls)])
        if not server.add_insecure_port(f"{host}:{port}"):
            raise OSError(f"cannot listen for gRPC on {host}:{port}")
        server.start()
        return server

    def _refuse(self, label: str, data: bytes, context) -> None:
        self.metrics.request(self.metrics.model_label(_model_name(self.m, data)), "", label, 503, 0.0)
        context.abort(grpc.StatusCode.UNAVAILABLE, f"the server holds its limit of {self.max_calls} gRPC calls in "
                                                   "progress; retry later")

    def _call(self, method, label: str):
        """The handler: parse, run ``method``, count it, map errors to TF Serving's status codes."""
        def handle(data: bytes, context) -> bytes:
            arrived = _ARRIVED.get() or time.monotonic()
            labels = [self.metrics.model_label(""), "", label]
            status, error = 200, None
            try:
                return method(data, context, arrived, labels).SerializeToString()
            except ServeError as exc:
                status, error = exc.http_status, (getattr(grpc.StatusCode, exc.code, grpc.StatusCode.INTERNAL), str(exc))
            except Exception as exc:  # a bug: answered as INTERNAL, logged, never a traceback to the client
                status, error = 500, (grpc.StatusCode.INTERNAL, f"Internal: {type(exc).__name__}: {exc}")
                log.exception(f"gRPC {label} failed")
            finally:
                if not context.is_active() and status == 200:
                    status = 499
                self.metrics.request(*labels, status, time.monotonic() - arrived)
            # aborted out here, not in the except clause: an exception raised there would tie the error's
            # frames (the request's message and tensors) in a cycle that only the garbage collector frees
            context.abort(*error)
        return handle

    def _parse(self, name: str, data: bytes):
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

    # -- methods -------------------------------------------------------------------------------
    def predict(self, data: bytes, context, arrived: float, labels: list):
        ticket = self.service.budget.ticket()
        token = CLAIM.set(ticket.claim)
        try:  # the message and its parsed copy, then each tensor before it is allocated (grpc_api.to_array)
            labels[0] = self.metrics.model_label(_model_name(self.m, data))
            ticket.claim(2 * len(data), "the PredictRequest")
            return self._predict(data, context, arrived, labels)
        finally:
            CLAIM.reset(token)
            ticket.close()

    def _predict(self, data: bytes, context, arrived: float, labels: list):
        request = self._parse("PredictRequest", data)
        served = self._acquire(request.model_spec, labels)
        try:
            signature = backends.signature(served.loaded, request.model_spec.signature_name)
            feeds = {}
            for name, proto in request.inputs.items():
                if name not in signature.inputs:
                    raise InvalidArgument(f"input tensor alias not found in signature: {name}. Inputs expected to be "
                                          f"in the set {{{','.join(sorted(signature.inputs))}}}.")
                array = grpc_api.to_array(proto, name, self.max_request_bytes)
                want = signature.inputs[name].dtype
                if array.dtype != want and not (want.kind in "OSU" and array.dtype.kind == "O"):
                    raise InvalidArgument(f"input '{name}': Expects arg[{sorted(signature.inputs).index(name)}] to be "
                                          f"{_type_name(want)} but {_type_name(array.dtype)} is provided")
                feeds[name] = array
            missing = sorted(set(signature.inputs) - set(feeds))
            if missing:
                raise InvalidArgument(f"input size does not match signature: {len(feeds)}!={len(signature.inputs)} "
                                      f"len({{{','.join(sorted(feeds))}}}) != len({{{','.join(sorted(signature.inputs))}}})."
                                      f" Missing inputs: {','.join(missing)}")
            remaining = context.time_remaining()
            job = self.service.submit(served, signature, feeds, arrived,
                                      None if remaining is None else time.monotonic() + remaining)
            del feeds
            outputs = self.service.outputs_blocking(job)
        finally:
            self.manager.release(served)
        wanted = list(request.output_filter) or sorted(outputs)
        unknown = [n for n in wanted if n not in outputs]
        if unknown:
            raise InvalidArgument(f"output tensor alias not found in signature: {unknown[0]} Outputs expected to be "
                                  f"in the set {{{','.join(sorted(outputs))}}}.")
        response = self.m["PredictResponse"]()
        self._model_spec(response.model_spec, request.model_spec.name, served.version, signature.key)
        for name in wanted:
            grpc_api.from_array(outputs[name], response.outputs[name])
        return response

    def metadata(self, data: bytes, context, arrived: float, labels: list):
        request = self._parse("GetModelMetadataRequest", data)
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field")
        unsupported = [f for f in fields if f != "signature_def"]
        if unsupported:
            raise InvalidArgument(f"Metadata field {unsupported[0]} is not supported")
        served = self._acquire(request.model_spec, labels)
        try:
            response = self.m["GetModelMetadataResponse"]()
            self._model_spec(response.model_spec, request.model_spec.name, served.version, "")
            defs = self.m["SignatureDefMap"]()
            self._signature_defs(served.loaded, defs)
            any_value = response.metadata["signature_def"]
            any_value.type_url = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
            any_value.value = defs.SerializeToString()
            return response
        finally:
            self.manager.release(served)

    def status(self, data: bytes, context, arrived: float, labels: list):
        request = self._parse("GetModelStatusRequest", data)
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
        return response

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _model_spec(out, name: str, version: int, signature_name: str) -> None:
        out.name = name
        out.version.value = version
        out.signature_name = signature_name

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


def _unserved(name: str):
    def method(data: bytes, context, arrived: float, labels: list):
        raise Unimplemented(f"kiln serve answers Predict, GetModelMetadata and GetModelStatus; {name} is not served")
    return method


def _model_name(messages: dict, data: bytes) -> str:
    """The model a request names (its ``model_spec``, field 1 of every request here, written first),
    read without parsing the rest of a message that may be large; "" when it is not there."""
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
        return messages["ModelSpec"].FromString(data[at:at + size]).name
    except Exception:  # not a request of ours: counted under "(other)"
        return ""


def _type_name(dtype) -> str:
    """TensorFlow's name of a dtype ("float", "double", "int32", "string")."""
    if dtype.kind in "OSU":
        return "string"
    return {"float32": "float", "float64": "double", "float16": "half"}.get(dtype.name, dtype.name)

