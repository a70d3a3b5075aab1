"""Runs one python-backend model instance (`model.py` with TritonPythonModel)."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import math
import logging
import os
import sys
import threading
import time
import traceback

from shm import datatypes
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.messages.worker import RESPONSE_STATS_INDICES, LoadInstance
from workers.batch_io import Reshaper
from workers.instance import Instance, WorkerLinks
from workers.python_backend import pb_utils
from workers.tensors import (ANSWERED, ANSWERED_FAILED, Copies, DeviceView, ErrorResponse,
                             is_device_array)

log = logging.getLogger("shmserve.python")

# Model files import this name; make it resolve to our implementation.
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

_OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # workers/


def describe_model_error(exc: BaseException) -> str:
    """An exception from model code in Triton's python-backend wording: its type and
    text, then "At:" and the model's frames, innermost first, as file(line): function.
    Frames of this worker (which called the model) are left out."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith(_OWN_CODE + os.sep)
              and not f.filename.startswith("<frozen")]
    text = f"{type(exc).__name__}: {exc}"
    if not frames:
        return text
    return text + "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n"
                                       for f in reversed(frames))


class ModelInitError(Exception):
    """initialize() of a model raised; the text names the model and where it raised."""


class PythonInstance(Instance):
    """One TritonPythonModel object and the glue between it and the wire. Its batches
    run on its own thread, so the worker's main thread keeps receiving (BLS answers,
    cancels) while execute() runs."""

    # the worker's services (WorkerLinks), given by connect() once loaded; None until
    # then (e.g. during warmup, when what the model sends is dropped)
    bls = None
    responder = None
    report_responses = None
    _loop: asyncio.AbstractEventLoop | None = None

    def __init__(self, msg: LoadInstance, config: dict):
        self.model_name = msg.model
        self.instance_name = msg.instance_name
        self.version = msg.version
        version_dir = os.path.join(msg.model_dir, str(msg.version))
        filename = config.get("default_model_filename") or "model.py"
        path = os.path.join(version_dir, filename)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"python model file not found: {path}")
        try:
            module = _import_model(path, f"_shmserve_model_{msg.instance}")
        except Exception as exc:  # a syntax error or a failed import in model.py
            # logged once, by the scheduler's "failed to load" line (the traceback,
            # this one its cause, by the worker at --log-verbose)
            raise ModelInitError(describe_model_error(exc)) from exc
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise ValueError(f"{path} defines no class TritonPythonModel")
        if msg.auto_complete and hasattr(cls, "auto_complete_config"):
            completed = cls.auto_complete_config(pb_utils.ModelConfig(config))
            if completed is not None:
                config = completed.as_dict() if hasattr(completed, "as_dict") else completed
        self.config = config
        # the config's `reshape`s, as Triton's core; None without any, so that the
        # three looks per request are a plain test, not a call of Reshaper.__bool__
        self.reshaper = Reshaper(config) or None
        self.output_types = {o["name"]: datatypes.from_config(o["data_type"])
                             for o in config.get("output", [])}
        self.copies = Copies()
        # Triton's python backend hands models host tensors unless this says "no"
        force = config.get("parameters", {}).get("FORCE_CPU_ONLY_INPUT_TENSORS", {})
        self.cpu_inputs = str(force.get("string_value", "yes")).lower() not in ("no", "false",
                                                                               "off", "0")
        self.model = cls()
        # `async def execute` runs on this instance's own event loop (Triton's
        # python backend does the same), where async_exec() is awaited
        self.is_async = inspect.iscoroutinefunction(getattr(self.model, "execute", None))
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # a batch may run on the worker's receiving thread while this instance's own
        # thread is idle (workers/main.py, Worker.run_inline): not for a model whose
        # execute runs an event loop or answers after returning
        self.inline = not self.is_async and not self.decoupled
        args = {
            "model_config": json.dumps(config),
            "model_instance_kind": "GPU" if msg.kind == "KIND_GPU" else "CPU",
            "model_instance_name": msg.instance_name,
            "model_instance_device_id": str(msg.device_id),
            "model_repository": msg.model_dir,
            "model_version": str(msg.version),
            "model_name": msg.model,
        }
        if hasattr(self.model, "initialize"):
            try:
                self.model.initialize(args)
            except Exception as exc:
                # The load table and every client asking for the model see this
                # text: Triton's, with the place in model.py that raised.
                raise ModelInitError(describe_model_error(exc)) from exc

    def connect(self, links: WorkerLinks) -> None:
        self.bls, self.responder, self.report_responses = links

    def finalize(self) -> None:
        if hasattr(self.model, "finalize"):
            self.model.finalize()
        loop = self._loop
        if loop is not None:
            if loop.is_running():  # a decoupled model's background loop
                loop.call_soon_threadsafe(loop.stop)
            else:
                loop.close()

    def execute(self, requests: list[InferRequest], io):
        """Per request: a list of (name, datatype, array), an InferError, or ANSWERED
        when its responses went (or will go) out through `self.responder` as the model
        sends them: every request of a decoupled model, and those a non-decoupled model
        answered with its response sender."""
        bls = self.bls
        if bls is None:  # warmup, or a worker without BLS: nothing to track
            return self._execute(requests, io, None)
        # what the model's BLS calls need: who calls (for the cycle check), which
        # tensors are our own inputs (passed on by reference), where copies count
        callers = list(dict.fromkeys(c for r in requests for c in r.callers))
        bls.model, bls.callers, bls.copies = self.model_name, callers, self.copies
        keys = [(r.reply_to, r.id) for r in requests]  # what a CancelRequest names
        try:
            return self._execute(requests, io, keys)
        finally:
            bls.input_refs = {}
            if not self.decoupled:  # a decoupled request may go on responding
                bls.cancels.done_many(keys)

    def _run_model(self, pb_requests):
        if not self.is_async:
            return self.model.execute(pb_requests)
        if self.decoupled:
            # Triton's python backend schedules a decoupled model's `async def execute`
            # on the instance's loop and returns at once: batches run concurrently and
            # answer through their response senders
            future = asyncio.run_coroutine_threadsafe(self.model.execute(pb_requests),
                                                      self._background_loop())
            future.add_done_callback(functools.partial(self._async_done, pb_requests))
            return None
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.model.execute(pb_requests))

    def _background_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True,
                             name=f"asyncio {self.model_name}").start()
        return self._loop

    def _async_done(self, pb_requests, future) -> None:
        """A decoupled async execute ended: if it raised, each request it left open
        ends with the error, as a response with the final flag."""
        exc = future.exception()
        if exc is None:
            return
        text = self._execute_error(exc)
        log.error("%s", text)
        error = pb_utils.TritonError(text)
        for request in pb_requests:
            try:
                sender = request.get_response_sender()
                if not sender._is_closed():
                    sender.send(pb_utils.InferenceResponse(error=error),
                                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception:
                log.exception("could not end a request of model '%s'", self.model_name)

    def _execute_error(self, exc: BaseException) -> str:
        # Triton's python backend wording, naming the instance that ran the batch
        return (f"Failed to process the request(s) for model '{self.instance_name}', "
                f"message: {describe_model_error(exc)}")

    def _execute(self, requests: list[InferRequest], io, keys):
        self.input_end_ns = self.output_start_ns = 0
        streams = [_ResponseStream(self, r) for r in requests]
        # set by a CancelRequest the scheduler forwards; one lock for the batch
        flags = (self.bls.cancels.track_many(keys) if keys is not None
                 else [None] * len(requests))
        pb_requests, failed = [], {}
        for i, (r, s, f) in enumerate(zip(requests, streams, flags)):
            try:
                pb_requests.append(self._request(r, io, s, f))
            except Exception as exc:
                # this request alone (e.g. its client shrank its region under it): the
                # model runs the others
                failed[i] = exc if isinstance(exc, InferError) else InferError(
                    ErrorCode.INVALID_ARG, f"failed to read inputs: {exc}")
        if failed:
            return self._without(requests, streams, failed, pb_requests)
        return self._run_batch(requests, streams, pb_requests)

    def _without(self, requests, streams, failed: dict, pb_requests):
        """Run the batch without the requests in `failed`, which end with their error."""
        for i in failed:
            streams[i].closed = True
            if self.decoupled and self.bls is not None:  # no cancel can matter now
                self.bls.cancels.done(requests[i].reply_to, requests[i].id)
        live = [i for i in range(len(requests)) if i not in failed]
        results = iter(self._run_batch([requests[i] for i in live],
                                       [streams[i] for i in live], pb_requests)
                       if live else ())
        return [failed[i] if i in failed else next(results) for i in range(len(requests))]

    def _run_batch(self, requests, streams, pb_requests):
        self.input_end_ns = time.monotonic_ns()
        for stream in streams:
            stream.last_end = self.input_end_ns
        try:
            responses = self._run_model(pb_requests)
            self.output_start_ns = time.monotonic_ns()
        except Exception as exc:
            text = self._execute_error(exc)
            log.error("%s", text)
            err = InferError(ErrorCode.INTERNAL, text)
            return [s.fail(err) for s in streams]
        if self.decoupled:
            if responses is not None:
                # Triton's python backend refuses this: responses of a decoupled model
                # go through its response senders only
                err = InferError(
                    ErrorCode.INTERNAL,
                    f"Python model '{self.model_name}' is using the decoupled mode and "
                    "the execute function must return None.")
                return [s.fail(err) for s in streams]
            return [s.after_execute() for s in streams]
        # Triton's non-decoupled response sender: a request whose sender the model took
        # may be answered through it before execute() returns or after (from a thread),
        # its place in the returned list None, or the whole list None
        senders = [pb._sender is not None for pb in pb_requests]
        if responses is None and all(senders):
            return [s.after_execute() for s in streams]
        if (responses is None or len(responses) != len(requests)
                or any(r is None and not taken for r, taken in zip(responses, senders))):
            got = "None" if responses is None else str(len(responses))
            err = InferError(
                ErrorCode.INTERNAL,
                f"model '{self.model_name}' execute() returned {got} responses for "
                f"{len(requests)} requests")
            return [s.fail(err) for s in streams]
        return [s.after_execute() if s.used or resp is None else s.returned(req, resp)
                for s, req, resp in zip(streams, requests, responses)]

    def _input(self, ref, io):
        tensor = self._input_tensor(ref, io)
        # a BLS call passes this tensor on as `ref` (not a reshaped one: `ref` has the
        # client's shape)
        if self.bls is not None and (not self.reshaper
                                     or list(tensor.shape()) == list(ref.shape)):
            self.bls.input_refs[id(tensor)] = (tensor, ref)
        return tensor

    def _input_tensor(self, ref, io):
        reshape = self.reshaper.input if self.reshaper else _same
        if self.cpu_inputs:
            return pb_utils.Tensor._from_server(
                ref.name, ref.datatype, reshape(ref.name, io.host_input(ref, self.copies)))
        if ref.device >= 0 and ref.data is None:
            # the client's CUDA memory, handed over as it is, by address: no cupy array
            # and no DLPack round trip per request (workers/tensors.py DeviceView)
            view = reshape(ref.name, io.device_input(ref))
            return pb_utils.Tensor._from_server_device(ref.name, ref.datatype, view.ptr,
                                                       view.shape, view.device, view.owner)
        array = reshape(ref.name, io.input(ref, self.copies))
        if is_device_array(array):  # e.g. a BLS caller's device tensor
            return pb_utils.Tensor.from_dlpack(ref.name, array)
        return pb_utils.Tensor._from_server(ref.name, ref.datatype, array)

    def _request(self, req: InferRequest, io, stream: "_ResponseStream", flag):
        inputs = [self._input(ref, io) for ref in req.inputs]
        requested = ([o.name for o in req.outputs] if req.outputs is not None
                     else list(self.output_types))
        flags = 0
        if req.sequence_start:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if req.sequence_end:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        return pb_utils.InferenceRequest._from_server(
            request_id=req.request_id,
            correlation_id=req.sequence_id,
            inputs=inputs,
            requested_output_names=requested,
            flags=flags,
            parameters_json=json.dumps(req.parameters) if req.parameters else "{}",
            model_name=self.model_name,
            model_version=self.version,
            timeout=req.timeout_us,
            decoupled=self.decoupled,
            send_response=stream.send,
            is_cancelled=flag.is_set if flag is not None else None,
        )

    def _outputs(self, req: InferRequest, resp):
        if resp is None or not hasattr(resp, "output_tensors"):
            return InferError(ErrorCode.INTERNAL,
                              f"model '{self.model_name}' returned {type(resp).__name__} "
                              "instead of an InferenceResponse")
        if resp.has_error():
            err = resp.error()
            code = err.code() if hasattr(err, "code") else ErrorCode.INTERNAL
            return ErrorResponse(ErrorCode(int(code)), err.message())
        wanted = None if req.outputs is None else {o.name for o in req.outputs}
        out = []
        for tensor in resp.output_tensors():
            name = tensor.name()
            if wanted is not None and name not in wanted:
                continue  # Triton returns only what was asked for
            datatype = tensor._datatype
            if tensor.is_cpu():
                array = tensor._host_array()  # BF16 as uint16 words, no copy
            else:  # device memory: written once, straight to its destination, by address
                ptr, shape, device = tensor._device_memory()
                dtype = datatypes.NUMPY[datatype]
                array = DeviceView(ptr, shape, dtype, math.prod(shape) * dtype.itemsize,
                                   device, tensor)
            expected = self.output_types.get(name)
            if expected is not None and expected != datatype:
                return InferError(
                    ErrorCode.INTERNAL,
                    f"unexpected datatype {datatypes.to_config(datatype)} for inference "
                    f"output '{name}' of model '{self.model_name}', expecting "
                    f"{datatypes.to_config(expected)}")
            if self.reshaper:  # the model's shape back to the config's dims
                array = self.reshaper.output(name, array)
            out.append((name, datatype, array))
        return out


class _ResponseStream:
    """The responses of one request, as the model sends them through its response
    sender (pb_utils has already applied Triton's flag and one-response rules).

    Decoupled: each response goes out as it is sent, from execute() or from a thread
    after execute() returned; send(None, FINAL) ends the request with an `empty`
    response. Not decoupled: the one response goes out, final, once the final flag
    comes (or when execute() returns)."""

    __slots__ = ("inst", "req", "used", "held", "closed", "last_end", "timings", "sent")

    def __init__(self, inst: PythonInstance, req: InferRequest):
        self.inst = inst
        self.req = req
        self.used = False  # the model has sent through the sender
        self.held = None  # a non-decoupled response waiting for its final flag
        self.closed = False  # the final response went out
        self.last_end = 0  # when the previous response went out (ns)
        # a decoupled model's (index, kind, start, output, end), of its first
        # RESPONSE_STATS_INDICES responses
        self.timings = []
        self.sent = 0  # responses sent: the next one's index

    def send(self, response, flags: int) -> None:
        if self.closed:  # e.g. after execute() failed and answered with an error
            raise pb_utils.TritonModelException(
                "Unable to send response. Response sender has been closed.")
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.used = True
        if not self.inst.decoupled:
            if response is not None:
                self.held = response
            if not final:
                return
            response, self.held = self.held, None
        if final:
            self.closed = True
            bls = self.inst.bls
            if bls is not None and self.inst.decoupled:  # no cancel can matter now
                bls.cancels.done(self.req.reply_to, self.req.id)
        respond = self.inst.responder
        if respond is None:
            return
        output_start = time.monotonic_ns()
        if response is None:
            kind = 2
            respond(self.req, None, final, True, None)
        else:
            params = response.parameters()
            result = self.inst._outputs(self.req, response)
            kind = 1 if isinstance(result, InferError) else 0
            respond(self.req, result, final, False,
                    json.loads(params) if params and params != "{}" else None)
        if self.inst.decoupled:
            end = time.monotonic_ns()
            if not final:
                # Let the frontend just woken run now if it waits for this CPU: the
                # kernel does not preempt a sender for the task it wakes, so a model
                # sending a burst would hold its responses back until its time slice
                # ended. Measured with 100 responses per request on 2 busy cores: time
                # to first response over gRPC 1.3 -> 0.7 ms; yielding for the first few
                # only does not help (the frontend's write needs CPU through the burst);
                # the price is more frontend wake-ups (HTTP streams: +20% server CPU).
                os.sched_yield()
            if self.sent < RESPONSE_STATS_INDICES:
                self.timings.append((self.sent, kind, self.last_end or output_start,
                                     output_start, end))
            self.sent += 1
            self.last_end = end
            if final and self.inst.report_responses is not None:
                self.inst.report_responses(self.req, self.timings)

    def after_execute(self):
        """execute() returned: a decoupled request stays open for later sends; a
        non-decoupled one sent without its final flag is complete now."""
        if not self.inst.decoupled and not self.closed and self.held is not None:
            self.send(None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return ANSWERED

    def returned(self, req: InferRequest, response):
        """execute() returned this request's response: it is the answer, and the
        sender is closed (a later send raises, as in Triton)."""
        self.closed = True
        return self.inst._outputs(req, response)

    def fail(self, err: InferError):
        """execute() failed: a request not answered yet gets `err` as its final
        response (through run_batch when nothing was sent for it yet). A non-decoupled
        one that sent its response already (a second send raised) gets that response,
        as Triton's client sees it: what follows the first is dropped."""
        if self.closed:
            return ANSWERED
        if self.held is not None and not self.inst.decoupled:
            self.send(None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return ANSWERED
        if not self.used or self.inst.responder is None:
            self.closed = True
            return err
        self.closed = True
        self.inst.responder(self.req, err, True, False, None)
        return ANSWERED_FAILED


def _import_model(path: str, module_name: str):
    # The model's folder goes on sys.path so model.py can import its neighbours.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _same(name, array):
    return array
