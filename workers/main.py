"""The worker process: hosts model instances and runs the batches sent to it.

One run loop over one inbox, on the main thread: it receives. Every instance runs its
batches on a thread of its own, fed by a queue, except that a python instance whose
thread is idle has its batch run on the main thread itself (Worker.run_inline).
Framework instances share the process of their device ("cpu" or "gpu:N"), so one
instance's compute overlaps another's (onnxruntime and torch release the GIL). A python
instance has a process of its own (its code holds the GIL), and its thread lets this
loop keep receiving while `execute` runs: the answers to the model's BLS calls and the
cancels of the requests it runs arrive here and are handed over
(workers/python_backend/bls.py), so a model that waits for another never waits on its
own inbox. Results go straight to each request's `reply_to`; the scheduler only hears
BatchDone (which carries the responses instead for models with preserve_ordering).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time

from shm import cuda  # its fake cupy (SHMSERVE_FAKE_CUDA) goes in before any model
from shm.arena import Arena
from shm.channel import Outbox
from shm.errors import ErrorCode, InferError
from shm.lifecycle import (die_with_parent, exit_orphaned, parent_gone, settle_heap,
                           watch_parent)
from shm.log import apply_log_settings, configure_logging
from shm.messages.frontend import CancelRequest
from shm.messages.leases import EndLease, LeaseEnded
from shm.messages.regions import RegionGone
from shm.messages.results import Error, InferResponse, PeerGone, ReleaseBlocks
from shm.messages.roles import WorkerSpec
from shm.messages.settings import LogSettings
from shm.messages.worker import (WORKER_INBOX, BatchDone, ExecuteBatch, InstanceLoaded,
                                 LoadInstance, ResponseStats, StopWorker, UnloadInstance,
                                 WorkerReady, done_address)
from shm.tensor import arena_blocks
from shm.transport import SOCKETS, Transport
from workers import warmup
from workers.backends import create_instance
from workers.instance import Instance, WorkerLinks
from workers.leases import Leases
from workers.python_backend import bls, pb_utils
from workers.python_backend.bls import BlsClient
from workers.waiting import WaitingBatches
from workers.sequence import SequenceContext
from workers.tensors import (ANSWERED, ANSWERED_FAILED, Copies, ErrorResponse, TensorIO,
                             targets_of, unpinner)

log = logging.getLogger("shmserve.worker")


class _Stop(BaseException):
    """Stop the worker. A BaseException, as SystemExit is: SIGTERM may raise it inside
    a model's execute (running inline on this thread), whose `except Exception`
    must not swallow it."""


# what a model receiving for itself inside an inline batch handles at once (the
# answers and cancels it may wait on, and releases that free arena blocks); all else
# waits for the batch to end
_PUMPED = (InferResponse, CancelRequest, ReleaseBlocks, RegionGone, LogSettings)


def gpu_of(device: str) -> int | None:
    """The GPU of a worker's --device ("gpu:N" -> N), None for "cpu"."""
    if device == "cpu":
        return None
    kind, _, index = device.partition(":")
    if kind != "gpu" or not index.isdigit():
        raise ValueError(f'--device must be "cpu" or "gpu:N", got {device!r}')
    return int(index)


def select_device(gpu: int) -> None:
    """Make `gpu` the calling thread's current device (cudaSetDevice: per thread), the
    one rule by which a worker is pinned to its GPU (see shm/devices.py)."""
    from shm.cuda import cupy
    cupy().cuda.Device(gpu).use()


class InstanceThread:
    """A framework instance's own thread: batches in through a queue, responses out
    through the thread's own Outbox (an Outbox belongs to one thread)."""

    def __init__(self, worker: "Worker", key: str, inst):
        self.worker = worker
        self.key = key
        self.inst = inst
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        # items given and items done, each counted by one thread only: the worker's
        # main thread may run a batch itself only while the two are equal
        self.given = 0
        self.done = 0
        self.outbox = worker.transport.outbox()
        self.thread = threading.Thread(target=self._run, name=f"instance {key}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.worker.gpu is not None:  # a new thread starts on device 0
                select_device(self.worker.gpu)
            while True:
                item = self.queue.get()
                if item is None:
                    break
                try:
                    if isinstance(item, str):  # a peer is gone: drop its socket
                        self.outbox.drop(item)
                    elif callable(item):  # the warmup, run before any batch
                        item(self.outbox)
                    else:
                        self.worker.run_batch(self.inst, item, self.outbox)
                finally:
                    self.done += 1
        finally:
            self.outbox.close()

    def give(self, item) -> None:
        self.given += 1
        self.queue.put(item)

    def idle(self) -> bool:
        return self.given == self.done

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join()


class Worker:
    """`transport` makes the channels (Unix sockets; shm/transport.py's MemoryHub runs
    a worker on a thread beside a scheduler loop in tests/loop/), `clock` stamps each
    batch's start and end for the statistics."""

    def __init__(self, name: str, address: str, scheduler: str, segment_prefix: str,
                 arena_bytes: int, device: str = "cpu", high_water: int | None = None,
                 transport: Transport = SOCKETS, clock=time.monotonic_ns):
        self.name = name
        self.transport = transport
        self.clock = clock
        self.address = address
        self.scheduler = scheduler
        self.done_address = done_address(scheduler)
        self.device = device
        self.inbox = transport.inbox(address, WORKER_INBOX)
        self.outbox = transport.outbox()
        pin = unpin = None
        self.gpu = gpu_of(device)
        if self.gpu is not None:
            # this thread works on the worker's own GPU (memory pinned here is pinned
            # for its context), not device 0; instance threads select it too
            select_device(self.gpu)
            # host memory the device copies from and to (arena segments, the segments
            # of other processes, clients' system regions) is pinned, for DMA speed
            from shm.cuda import pin, unpin
        # Arena chunks are created on first large output, not at start, so a model
        # that only answers with small tensors costs no shared memory.
        self.arena = Arena(segment_prefix, chunk_size=arena_bytes, on_segment=pin,
                           high_water=high_water, on_release=unpinner(unpin))
        self.io = TensorIO(self.arena, address, pin, unpin, device=self.gpu)
        self.instances = {}
        self.threads: dict[str, InstanceThread] = {}
        # python models' calls to other models, and the cancel flags of what runs here
        self.bls = BlsClient(address, scheduler, self.io, transport.outbox())
        self.waiting = WaitingBatches()  # ahead batches not started (workers/waiting.py)
        self.leases = Leases()  # instances lent to frontends (workers/leases.py)
        # the process's BLS hooks, put back as they were by close()
        self._hooks = (pb_utils._bls_executor, pb_utils._bls_async_executor)
        pb_utils._bls_executor = self.bls.exec
        pb_utils._bls_async_executor = self.bls.async_exec
        self.sequences: dict[str, SequenceContext] = {}  # stateful instances
        # responses a python model sends through its response sender, from any thread
        # (decoupled models send from their own threads after execute returned): an
        # Outbox of their own, one sender at a time
        self.response_outbox = transport.outbox()
        self.response_lock = threading.Lock()
        # Receiving: this process's main thread, or a model waiting inside a batch
        # that runs inline on it (pump); what a pump cannot handle waits in `deferred`
        self.receiving = threading.Lock()
        self.deferred: collections.deque = collections.deque()
        self.pumped = False
        self.handlers = {
            LoadInstance: self.on_load,
            ExecuteBatch: self.on_execute,
            UnloadInstance: self.on_unload,
            ReleaseBlocks: self.on_release,
            PeerGone: self.on_peer_gone,
            RegionGone: self.on_region_gone,
            StopWorker: self.on_stop,
            LogSettings: self.on_log_settings,
            InferResponse: self.bls.on_response,
            CancelRequest: self.on_cancel,
            EndLease: self.on_end_lease,
        }

    def run(self) -> None:
        self.outbox.send(self.scheduler, WorkerReady(self.name, self.address, os.getpid()))
        handlers, deferred, lock = self.handlers, self.deferred, self.receiving
        try:
            io, idle = self.io, self.arena.idle
            while True:
                with lock:  # a model receiving for itself (pump) may hold it a moment
                    if deferred:
                        msg = deferred.popleft()
                    else:
                        # wake to give idle arena segments back (Arena.trim), else
                        # sleep until a message comes
                        wait = io.next_trim() if idle else None
                        msg = self.inbox.recv() if wait is None else \
                            self.inbox.recv(int(wait * 1000) + 50)
                if msg is None:
                    io.trim()
                    continue
                handlers[type(msg)](msg)
        except _Stop:
            pass
        finally:
            self.close()

    def close(self) -> None:
        self.bls.close()  # a model waiting on a call gets an error and returns
        pb_utils._bls_executor, pb_utils._bls_async_executor = self._hooks
        for t in self.threads.values():
            t.stop()
        self.threads.clear()
        for name, inst in list(self.instances.items()):
            try:
                inst.finalize()
            except Exception:
                log.exception("finalize() of %s failed", name)
        self.instances.clear()
        held = self.arena.used_bytes()
        if held:  # every reader releases what it read before the server stops
            log.warning("%d bytes of worker %s's arena were never released", held, self.name)
        self.io.close()
        self.arena.close()
        self.inbox.close()
        self.outbox.close()
        with self.response_lock:
            self.response_outbox.close()

    # -- handlers ---------------------------------------------------------------------

    def on_load(self, msg: LoadInstance) -> None:
        try:
            inst, config = create_instance(msg)
            seq = self._sequence_context(msg, inst, config)
        except Exception as exc:  # the reason goes to the model's state, not a crash
            # The scheduler logs the reason in one line ("failed to load 'm' version
            # 1: ..."), as Triton does; our own frames help only who debugs the server.
            log.debug("failed to load %s", msg.instance, exc_info=True)
            self.outbox.send(self.scheduler, InstanceLoaded(msg.instance, False,
                                                            error=_reason(exc)))
            return
        inst.connect(WorkerLinks(self.bls, functools.partial(self.respond, inst),
                                 functools.partial(self.report_responses, msg.instance)))
        # Registered before its warmup: after a failed one, the scheduler's
        # UnloadInstance (or StopWorker) finalizes it like any other instance.
        self.instances[msg.instance] = inst
        if seq is not None:
            self.sequences[msg.instance] = seq
        if inst.threaded:
            thread = self.threads[msg.instance] = InstanceThread(self, msg.instance, inst)
            # on the instance's own thread, as Triton does, so this loop keeps feeding
            # the device's other instances while this one warms up
            thread.give(functools.partial(self.warm_up, inst, msg, config))
        else:
            self.warm_up(inst, msg, config, self.outbox)

    @staticmethod
    def _sequence_context(msg: LoadInstance, inst: Instance,
                          config: bytes) -> SequenceContext | None:
        """A stateful model's instance gets its controls and state store."""
        parsed = json.loads(config)
        if not parsed.get("sequence_batching"):
            return None
        device_array = None
        if inst.stream is not None:  # a GPU instance keeps state there
            from shm.cuda import cupy
            device_array = cupy().asarray
        return SequenceContext(parsed, msg.model_dir, device_array)

    def warm_up(self, inst, msg: LoadInstance, config: bytes, outbox: Outbox) -> None:
        """Run the model's warmup samples on `inst`, then answer the load: the instance
        is loaded only once every sample ran without error. Passive instances take no
        requests, and Triton does not warm them up."""
        try:
            if not msg.passive:
                samples = warmup.samples(json.loads(config), msg.model, msg.version,
                                         msg.model_dir)
                warmup.run(inst, samples, self.io, f"instance {msg.instance_name}")
                if samples:
                    inst.copies = Copies()  # counted from the first real batch on
            reply = InstanceLoaded(msg.instance, True, config=config)
        except Exception as exc:
            log.error("failed to load %s: %s", msg.instance, _reason(exc))
            reply = InstanceLoaded(msg.instance, False, error=_reason(exc))
        outbox.send(self.scheduler, reply)

    def on_unload(self, msg: UnloadInstance) -> None:
        thread = self.threads.pop(msg.instance, None)
        if thread is not None:
            thread.stop()
        inst = self.instances.pop(msg.instance, None)
        self.sequences.pop(msg.instance, None)
        if inst is not None:
            inst.finalize()
        self._end_held(msg.instance)  # what its frontend still sends goes on

    def on_end_lease(self, msg: EndLease) -> None:
        """The scheduler takes its lease back: from now on what the frontend sends
        under it goes on to the scheduler; the end is told once the last batch sent
        under it has ended (a batch still with the instance's thread comes first)."""
        held = self.leases.end(msg.instance, msg.lease)
        frontend = held[0] if held is not None else None
        thread = self.threads.get(msg.instance)
        if thread is not None and not thread.idle():
            thread.give(lambda outbox: self._lease_over(msg.instance, msg.lease, frontend,
                                                        outbox))
        else:
            self._lease_over(msg.instance, msg.lease, frontend, self.outbox)

    def _end_held(self, instance: str, lease: int = 0) -> None:
        """End the lease on `instance` (only `lease`, if given) if one is held, and
        tell its frontend and the scheduler now: no batch of it runs any more."""
        held = self.leases.end(instance, lease)
        if held is not None:
            self._lease_over(instance, held[1], held[0], self.outbox)

    def _lease_over(self, instance: str, lease: int, frontend: str | None,
                    outbox: Outbox) -> None:
        ended = LeaseEnded(instance, lease)
        if frontend is not None:  # first: it hears before the scheduler can act on it
            outbox.send(frontend, ended)
        outbox.send(self.scheduler, ended)

    def _hand_on(self, msg: ExecuteBatch) -> None:
        """A frontend's request sent under a lease that is over (it had not heard):
        the scheduler takes it as if sent there, and the frontend hears again."""
        if self.waiting.forget(msg):
            return  # cancelled while it waited here: answered, and counted
        for request in msg.requests:
            self.outbox.send(self.scheduler, request)
            self.outbox.send(request.reply_to, LeaseEnded(msg.instance, msg.lease,
                                                          request=request.id))

    def respond(self, inst, request, result, final: bool, empty: bool = False,
                parameters: dict | None = None) -> None:
        """Send one response of `request` now, from whichever thread the model sent it:
        `result` is (name, datatype, array) outputs, an InferError, or None with `empty`
        (send(None, FINAL): the request is complete, no response goes with it)."""
        if result is None:
            response = InferResponse(request.id, final=final, empty=empty)
        else:
            if not isinstance(result, InferError):
                try:
                    refs = self._write_outputs(request, result, inst.copies, request.model)
                    response = InferResponse(request.id, outputs=refs, owner=self.address,
                                             final=final, parameters=parameters or {})
                except InferError as exc:
                    result = exc
            if isinstance(result, InferError):
                response = InferResponse(request.id, error=Error(result.code, result.message),
                                         final=final)
        with self.response_lock:
            self.response_outbox.send(request.reply_to, response)

    def _write_outputs(self, request, result, copies, what: str, sync: bool = True) -> list:
        """Write `result`'s outputs where `request` wants them; their refs. Any failure
        comes out as an InferError (a bug here is logged and becomes INTERNAL), for the
        caller to answer the request with. sync=False: see TensorIO.write."""
        try:
            return self.io.write(result, targets_of(request), request.reply_to, copies,
                                 sync)
        except InferError:
            raise
        except Exception as exc:
            log.exception("failed to return outputs of %s", what)
            raise InferError(ErrorCode.INTERNAL,
                             f"failed to return outputs: {_reason(exc)}") from exc

    def report_responses(self, instance: str, request, timings: list) -> None:
        """A decoupled request is complete: its responses' timings, for the
        scheduler's per-response statistics (any thread)."""
        with self.response_lock:
            self.response_outbox.send(self.scheduler, ResponseStats(
                instance, timings, request.reply_to, request.id))

    def on_release(self, msg: ReleaseBlocks) -> None:
        self.io.released(msg.reader, msg.blocks)

    def on_peer_gone(self, msg: PeerGone) -> None:
        for over in self.waiting.peer_gone(msg.address):
            self._over(*over)
        for instance, lease in self.leases.of(msg.address):
            self.leases.end(instance)
            self.outbox.send(self.scheduler, LeaseEnded(instance, lease))
        self.outbox.drop(msg.address)
        with self.response_lock:
            self.response_outbox.drop(msg.address)
        for t in self.threads.values():
            t.give(msg.address)
        self.io.segments.forget(msg.segment_prefix)
        self.io.forget_reader(msg.address)

    def on_region_gone(self, msg: RegionGone) -> None:
        # no request uses the region any more (the scheduler waited for that)
        self.io.regions.forget(msg.uid)

    def on_log_settings(self, msg: LogSettings) -> None:
        apply_log_settings(f"worker[{self.name}]", msg)

    def on_cancel(self, msg: CancelRequest) -> None:
        # the scheduler forwards a client's cancel of a request running here, or
        # waiting here behind a running batch (taken out and answered at once)
        taken = self.waiting.cancel(msg.reply_to, msg.id)
        if taken is None:
            self.bls.cancels.cancel(msg.reply_to, msg.id)
            return
        response = InferResponse(msg.id, error=Error(ErrorCode.CANCELLED,
                                                     "request was cancelled"))
        batch = taken[0]
        if batch is not None and batch.lease and not batch.direct and self.leases.holds(
                batch.instance, msg.reply_to, batch.lease):
            # it carried a deep lease's grant: the frontend learns of it all the same
            response.lease = (batch.lease, batch.instance, self.address,
                              batch.lease_depth or 1)
        with self.response_lock:
            self.response_outbox.send(msg.reply_to, response)
        self._over(*taken)

    def _over(self, batch: ExecuteBatch | None, taken: list[int]) -> None:
        """An ahead batch whose requests were all taken out is done: its BatchDone goes
        now, so the scheduler counts them and may send the next to wait."""
        if batch is None:
            return
        now = self.clock()
        done = BatchDone(batch.batch_id, batch.instance, now, now, now, now,
                         cancelled=taken)
        if batch.direct:  # the scheduler never saw it: what its statistics need
            done.direct = [(r.start_ns, r.batch_size) for r in batch.requests]
        with self.response_lock:
            self.response_outbox.send(self.done_address if batch.quiet else self.scheduler,
                                      done)

    def on_stop(self, msg: StopWorker) -> None:
        self._hand_on_unread()
        raise _Stop()

    def _hand_on_unread(self) -> None:
        """Requests that frontends sent under a lease and that wait here unread go on
        to the scheduler instead of dying with this process: a frontend that had not
        yet heard its lease end sends them after the end, and the scheduler may stop
        the worker first (an unload, a reload to a new version)."""
        if not self.receiving.acquire(blocking=False):
            return  # a model thread is receiving: it stops with the rest
        try:
            unread = list(self.deferred)
            self.deferred.clear()
            while (msg := self.inbox.recv(0)) is not None:
                unread.append(msg)
        finally:
            self.receiving.release()
        for msg in unread:
            if type(msg) is ExecuteBatch and msg.direct:
                self._end_held(msg.instance, msg.lease)  # not yet ended: its end first
                self._hand_on(msg)

    def on_execute(self, msg: ExecuteBatch) -> None:
        if msg.lease:
            frontend = msg.requests[0].reply_to
            if not msg.direct:  # the scheduler lends the instance with this batch
                self.leases.grant(msg.instance, frontend, msg.lease)
            elif (not self.leases.holds(msg.instance, frontend, msg.lease)
                  or msg.instance not in self.instances):
                self._hand_on(msg)
                return
        if msg.ahead:  # sent to wait behind its instance's running batch
            self.waiting.arrived(msg)
        thread = self.threads.get(msg.instance)
        if thread is not None and not (thread.inst.inline and thread.idle()):
            thread.give(msg)  # this thread goes on receiving meanwhile
            return
        if msg.ahead:
            # it starts on this thread now: what came after it (a cancel, a
            # frontend's end) is read first
            self._read_ahead()
        if thread is None:
            self.run_batch(self.instances.get(msg.instance), msg, self.outbox)
        else:
            self.run_inline(thread, msg)

    def run_inline(self, thread: InstanceThread, msg: ExecuteBatch) -> None:
        """Run a batch here, on the receiving thread, instead of handing it to the
        instance's thread: one thread wake-up and GIL hand-over less per batch
        (c=1 p50 -45 us, worker CPU -10 us per request; issue 12's closing note).

        Only for an instance that says it may (`inline`: a python model whose
        execute is a plain function, not decoupled), and only while its thread is
        idle. While the batch runs nobody else receives, so a model that waits on a
        message (a BLS answer, is_cancelled()) receives for itself through `pump`;
        the first time one does, its later batches go to its thread, which lets this
        one receive meanwhile as before."""
        inst = thread.inst
        self.pumped = False
        bls.set_pump(self.pump)
        try:
            self.run_batch(inst, msg, thread.outbox)
        finally:
            bls.set_pump(None)
            if self.pumped:
                inst.inline = False

    def _read_ahead(self) -> None:
        """Read what has come without waiting: cancels, releases and frontends' ends
        are handled now, everything else after what is in hand (as pump does)."""
        lock = self.receiving
        if not lock.acquire(blocking=False):
            return  # a model is receiving for itself: it handles them
        try:
            while (msg := self.inbox.recv(0)) is not None:
                kind = type(msg)
                if kind in _PUMPED or kind is PeerGone:
                    self.handlers[kind](msg)
                    continue
                if kind is ExecuteBatch and msg.ahead:
                    self.waiting.arrived(msg)
                self.deferred.append(msg)
        finally:
            lock.release()

    def pump(self, timeout_ms: int) -> None:
        """Receive one message for a model waiting inside an inline batch (any of its
        threads): BLS answers, cancels and releases are handled now, the rest after
        the batch. A StopWorker fails the calls waiting, as close() would."""
        self.pumped = True
        lock = self.receiving
        if not (lock.acquire(timeout=timeout_ms / 1000) if timeout_ms else
                lock.acquire(blocking=False)):
            return
        try:
            # only the inbox: what waits in `deferred` is for after the batch, and
            # taking it again would keep what comes next (a cancel, an answer) out
            msg = self.inbox.recv(timeout_ms)
            if msg is None:
                return
            kind = type(msg)
            if kind in _PUMPED:
                self.handlers[kind](msg)
                return
            if kind is StopWorker:
                self.bls.close()
            elif kind is ExecuteBatch and msg.ahead:
                self.waiting.arrived(msg)  # a cancel may take its requests out meanwhile
            self.deferred.append(msg)
        finally:
            lock.release()

    def run_batch(self, inst, msg: ExecuteBatch, outbox: Outbox) -> None:
        """Run one batch on `inst` and answer every request, then the scheduler."""
        taken: list[int] = []
        if msg.ahead:  # what a cancel or a frontend's end took out does not run
            turn = self.waiting.start(msg)
            if turn is None:
                return  # all taken out: its BatchDone went then
            msg, taken = turn
        start = self.clock()
        failed = []
        copies = inst.copies if inst is not None else Copies()
        if inst is None:
            results = [InferError(ErrorCode.UNAVAILABLE,
                                  f"instance {msg.instance} is not loaded")] * len(msg.requests)
            input_end = output_start = start
        else:
            seq = self.sequences.get(msg.instance) if msg.slots else None
            if seq is None:
                results = inst.execute(msg.requests, self.io)
            else:  # a stateful model: rows with controls and state (workers/sequence.py)
                try:
                    rows, order = seq.rows(msg)
                    results = seq.results(msg, rows, order, inst.execute(rows, self.io))
                except Exception as exc:
                    log.exception("sequence batch of %s failed", msg.instance)
                    results = [InferError(ErrorCode.INTERNAL, _reason(exc))] * len(
                        msg.requests)
            # the instance stamps when its inputs were ready and when the model returned
            input_end = inst.input_end_ns or start
            output_start = inst.output_start_ns or input_end
        responses = []
        for i, (request, result) in enumerate(zip(msg.requests, results)):
            if result is ANSWERED or result is ANSWERED_FAILED:
                # its responses went out as the model sent them
                if result is ANSWERED_FAILED:
                    failed.append(i)
                responses.append(None)
                continue
            if not isinstance(result, InferError):
                try:
                    refs = self._write_outputs(request, result, copies, msg.instance,
                                               sync=False)
                    responses.append(InferResponse(request.id, outputs=refs,
                                                   owner=self.address))
                    continue
                except InferError as exc:
                    result = exc
            if not isinstance(result, ErrorResponse):  # a success in statistics
                failed.append(i)
            responses.append(InferResponse(request.id,
                                           error=Error(result.code, result.message)))
        # once for the batch: its copies into clients' CUDA regions are complete
        try:
            self.io.wait_for_device()
        except Exception as exc:  # the device failed: no output can be trusted
            log.exception("waiting for the output copies of %s failed", msg.instance)
            error = Error(ErrorCode.INTERNAL, f"failed to return outputs: {_reason(exc)}")
            for i, (request, r) in enumerate(zip(msg.requests, responses)):
                if r is None:
                    continue
                if r.outputs:
                    self.io.released(request.reply_to, arena_blocks(r.outputs))
                if i not in failed:
                    failed.append(i)
                responses[i] = InferResponse(r.id, error=error)
        if taken:  # indices as the scheduler sent the batch
            kept = [i for i in range(len(msg.requests) + len(taken)) if i not in taken]
            failed = [kept[i] for i in failed]
        done = BatchDone(msg.batch_id, msg.instance, start, input_end, output_start,
                         self.clock(), failed, copies.as_list(), cancelled=taken)
        if msg.lease:
            request = msg.requests[0]
            if msg.direct:  # the scheduler has no record of it: what statistics need
                done.direct = [(request.start_ns, request.batch_size)]
            elif responses[0] is not None and self.leases.holds(
                    msg.instance, request.reply_to, msg.lease):
                # the frontend learns of its lease with the answer
                responses[0].lease = (msg.lease, msg.instance, self.address,
                                      msg.lease_depth or 1)
        if msg.relay:
            # preserve_ordering: the scheduler releases them in request order; a request
            # answered as the model sent gets a placeholder that frontends ignore
            done.responses = [r if r is not None else InferResponse(q.id, final=False,
                                                                    empty=True)
                              for q, r in zip(msg.requests, responses)]
            outbox.send(self.scheduler, done)
            return
        outbox.send_many([*((request.reply_to, response)
                            for request, response in zip(msg.requests, responses)
                            if response is not None),
                          (self.done_address if msg.quiet else self.scheduler, done)])


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text


def main(argv: list[str] | None = None) -> None:
    args = WorkerSpec.from_argv(sys.argv[1:] if argv is None else argv)
    configure_logging(f"worker[{args.name}]", args.log_settings)

    def on_term(signum, frame):
        if parent_gone():  # the scheduler was killed: nobody waits for a clean stop
            exit_orphaned(args.segment_prefix, args.address)
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduler coordinates shutdown
    die_with_parent(signal.SIGTERM)
    watch_parent(args.segment_prefix, args.address)  # a model's call may hold the thread
    if args.cuda_sync != "auto":  # before any model or region makes a context current
        set_on = cuda.set_sync(args.cuda_sync)
        log.info("--cuda-sync %s on GPU(s) %s", args.cuda_sync, set_on)
    worker = Worker(args.name, args.address, args.scheduler, args.segment_prefix,
                    args.arena_bytes, args.device, args.arena_high_water)
    settle_heap()  # before any model: what a model makes stays collectable at unload
    worker.run()
    sys.exit(0)


if __name__ == "__main__":
    from shm.lifecycle import run_main
    run_main(main, "worker")
