"""The frontend's data plane: what the HTTP and gRPC servers call (types.DataPlane),
backed by the scheduler.

It keeps the model table the scheduler pushes, validates requests against it, puts
large inputs into this process's arena (the one copy of a request's input on the way
to the model), sends one InferRequest, and hands the worker's InferResponses to the
request's ResponseStream as they arrive (one for most models, zero to many for a
decoupled one; the last carries `final`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import time
from typing import Any, Callable

import msgspec

from tritonclient.grpc import model_config_pb2

from frontend.body_budget import BodyBudget, BodyQuota
from frontend.cache_key import cache_key
from frontend.types import (DecodedRequest, InferResult, ModelView, OutputTensor,
                            not_ready_error)
from frontend.validate import validate_request
from shm.arena import Arena, SegmentCache
from shm.channel import Inbox, Outbox
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import (FRONTEND_INBOX, CacheInsert, CancelRequest, Drain,
                                   InferRequest, ModelStateUpdate, RequestedOutput,
                                   ServerState, StatsReply, StatsRequest)
from shm.messages.leases import LeaseEnded, LeaseQueue, goes_direct
from shm.messages.regions import (RegionOp, RegionReply, RegionRequest, RegionShared,
                                  RegionUnshared, bind, in_bounds)
from shm.messages.repository import (IndexEntry, ModelReadyState, RepositoryOp,
                                     RepositoryReply, RepositoryRequest)
from shm.log import apply_log_settings
from shm.messages.results import Error, InferResponse, PeerGone, ReleaseBlocks
from shm.messages.settings import (LogSettings, LogSettingsReply, LogSettingsRequest,
                                   TraceSettingReply, TraceSettingRequest)
from shm.messages.worker import ExecuteBatch, done_address
from shm.tensor import INLINE_MAX, TensorRef

log = logging.getLogger("shmserve.frontend")


# A decoupled request's responses wait here while its reader is behind: the transport
# takes the next only once the client's flow-control window (or socket) has room. A
# client that reads none of them would have the frontend hold every response the model
# sends (a 4 MB request to a model that answers each element held +340 MiB in 12 s and
# went on growing). So a request is cancelled, as a client's cancel would (the model
# sees is_cancelled(); what it still sends is released unread), and its reader gets
# one final error in place of what waited, when
# - UNREAD_MAX responses wait and the reader has taken none for UNREAD_STALL seconds:
#   its client reads nothing (a client that reads, however slowly, is never cut off
#   by this, and a stalled one holds at most what the model makes in that time);
# - or, reading or not, UNREAD_HARD_MAX responses or UNREAD_BYTES_MAX bytes of
#   outputs wait (in the worker's arena, which the model's other requests share, or
#   inline in this process);
# - or more than UNREAD_MAX wait and the process holds WAITING_MAX for all its
#   clients: slow readers, each within its own bounds, on many streams.
# Counts leave out the response the reader is taking next. A tritonclient stream
# reading as fast as Python lets it fell 4,096 behind the repeat test model within a
# second, and kept reading.
UNREAD_MAX = 4096
UNREAD_STALL = 5.0
UNREAD_HARD_MAX = 1 << 18
UNREAD_BYTES_MAX = 64 << 20
WAITING_MAX = 1 << 20  # responses, about 300 MiB of them
UNREAD_ERROR = ("{} responses ({} bytes) of this request waited for a client that {}: "
                "the request was cancelled")
STALLED = "read none of them for %g s" % UNREAD_STALL
_now = time.monotonic
# lease ids heard ended before the answer that granted them came (another connection):
# remembered up to this many
ENDED_MAX = 256


class Lease:
    """An instance lent to this frontend (shm/messages/leases.py): its requests for the
    instance's model version go to its worker straight, up to `depth` at once
    (`inflight`: those sent and not answered yet, by request id)."""

    __slots__ = ("id", "instance", "address", "depth", "inflight", "told")

    def __init__(self, lease_id: int, instance: str, address: str, depth: int = 1):
        self.id = lease_id
        self.instance = instance
        self.address = address
        self.depth = depth
        self.inflight: set[int] = set()
        self.told = 0  # the waiting count the scheduler last heard (LeaseQueue)


class Laggards:
    """The streams with more than UNREAD_MAX responses waiting, looked at once a
    second while there are any: one whose reader has stopped is given up even when
    its model has stopped sending (nothing else would look at it again)."""

    def __init__(self):
        self.streams: set[ResponseStream] = set()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, stream: "ResponseStream") -> None:
        self.streams.add(stream)
        if self.timer is None:
            self.timer = stream.core.outbox.loop.call_later(1.0, self.sweep)

    def sweep(self) -> None:
        self.timer = None
        now = _now()
        for stream in list(self.streams):
            if stream.closed or stream.done or len(stream.items) <= UNREAD_MAX:
                self.streams.discard(stream)
            elif now - stream.last_read > UNREAD_STALL:
                self.streams.discard(stream)
                stream._give_up(None, STALLED)
        if self.streams:
            self.timer = next(iter(self.streams)).core.outbox.loop.call_later(
                1.0, self.sweep)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ResponseStream:
    """The responses of one request, in the order the worker sent them.

    `next()` waits for the next one: (InferResult, final), (InferError, final) for an
    error response, or (None, True) for a decoupled model's empty final
    (send(None, FINAL)). The request's input blocks are freed when its final response
    arrives, whoever reads it. `cancel()` (or cancelling a task waiting in `next()`)
    sends CancelRequest and drops what still comes. A reader that stopped taking them
    (UNREAD_MAX, UNREAD_STALL) or is far behind (UNREAD_HARD_MAX) gets the request
    cancelled and one final error instead of what waited."""

    __slots__ = ("core", "rid", "view", "request", "blocks", "key", "items", "sizes",
                 "unread_bytes", "last_read", "waiter", "done", "closed", "direct",
                 "handing", "on_done")

    def __init__(self, core: "SchedulerDataPlane", rid: int, view: ModelView,
                 request: DecodedRequest, blocks: list, key: bytes | None):
        self.core = core
        self.rid = rid
        self.view = view
        self.request = request
        self.blocks = blocks
        self.key = key
        self.items: collections.deque = collections.deque()
        self.sizes: collections.deque = collections.deque()  # each item's arena bytes
        self.unread_bytes = 0  # theirs in all (the reader's next item not counted)
        # while the reader is behind: since when (it last took one, or responses began
        # to wait behind the next); read only then, so a request that never waits
        # costs no clock reading
        self.last_read = 0.0
        self.waiter: asyncio.Future | None = None
        self.done = False  # the final response was read
        self.closed = False  # cancelled: responses still coming are released unread
        self.direct = ""  # sent under a lease: the worker's inbox (its cancel goes there)
        # the lease it was sent under ended before the worker read it: the worker hands
        # it on to the scheduler (and says so), or stops without reading it
        self.handing = 0
        # start_unary's: called with the answer instead of waking a reader
        self.on_done: Callable[[Any], None] | None = None

    async def next(self):
        while not self.items:
            if self.done:
                raise InferError(ErrorCode.INTERNAL, "the request has no more responses")
            # the core's loop, not asyncio.get_running_loop(): in Python 3.11 that
            # asks the kernel for the pid (getpid()) on every call
            self.waiter = self.core.outbox.loop.create_future()
            try:
                await self.waiter
            except asyncio.CancelledError:
                self.cancel()  # the client went away
                raise
            finally:
                self.waiter = None
        return self.take()

    def take(self):
        """The next response, which is here: (result, final) as next() gives it."""
        msg: InferResponse = self.items.popleft()
        self.unread_bytes -= self.sizes.popleft()
        if self.items:  # behind: when it last took one counts (else nothing waits)
            self.last_read = _now()
            self.core.waiting -= 1
        if msg.final:
            self.done = True
        return self.outcome(msg), msg.final

    def outcome(self, msg: InferResponse):
        """What a response says to the reader: an InferResult, an InferError, or None
        for an empty final one."""
        if msg.error is not None:
            return InferError(msg.error.code, msg.error.message)
        if msg.empty:
            return None
        return self.core._result(self.view, self.request, msg)

    def cancel(self) -> None:
        """Stop reading: the scheduler drops the request if it has not run, and the
        responses that still arrive are released unread."""
        if self.done or self.closed:
            return
        self._close()

    def _close(self) -> None:
        self.closed = True
        self.on_done = None  # never called now: what it holds may go
        core = self.core
        if self.items:
            core.waiting -= len(self.items) - 1
        while self.items:
            core._release_unclaimed(self.items.popleft())
        self.sizes.clear()
        self.unread_bytes = 0
        if self.rid in core.pending:
            to = self.direct if self.direct and not self.handing else core.scheduler
            core.outbox.send(to, CancelRequest(self.rid, core.address))

    def _deliver(self, msg: InferResponse) -> None:
        if self.closed:
            self.core._release_unclaimed(msg)
            return
        items = self.items
        if self.on_done is not None and msg.final and not items:
            # a task-less unary call's one response: its answer, not queued
            self.done = True
            self._answer(self.outcome(msg))
            return
        if items:  # the reader is behind: what it has not read counts
            size = sum(len(r.data) if r.data is not None else r.nbytes
                       for r in msg.outputs if not r.region)
            core = self.core
            if len(items) > UNREAD_MAX:
                if len(items) > UNREAD_HARD_MAX:
                    return self._give_up(msg, "reads too slowly")
                if _now() - self.last_read > UNREAD_STALL:
                    return self._give_up(msg, STALLED)
                if core.waiting >= WAITING_MAX:
                    return self._give_up(msg, "reads too slowly while the frontend "
                                              "holds %d responses for its clients"
                                         % core.waiting)
                core.laggards.add(self)  # judged again, should no more come
            if self.unread_bytes + size > UNREAD_BYTES_MAX:
                return self._give_up(msg, "reads too slowly")
            if len(items) == 1:  # the first to wait behind the reader's next
                self.last_read = _now()
            core.waiting += 1
            self.unread_bytes += size
            self.sizes.append(size)
        else:
            self.sizes.append(0)
        items.append(msg)
        self._wake()

    def _wake(self) -> None:
        if self.on_done is not None:
            self._unary_step()
            return
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _unary_step(self) -> None:
        """Responses of a start_unary request are here: the final one is its answer,
        the others are dropped (as infer() counts only the final one)."""
        while self.items:
            result, final = self.take()
            if final:
                self._answer(result)
                return
            if isinstance(result, InferResult):
                result.release()

    def _answer(self, result) -> None:
        on_done, self.on_done = self.on_done, None
        on_done(self.core._unary_answer(self, result))

    def _give_up(self, msg: InferResponse | None, why: str) -> None:
        """Cancel the request, and leave the reader one final error in place of all it
        did not take."""
        count, nbytes = len(self.items), self.unread_bytes
        if msg is not None:
            self.core._release_unclaimed(msg)
        self._close()
        message = UNREAD_ERROR.format(count, nbytes, why)
        log.warning("request %s of model '%s': %s", self.request.id or self.rid,
                    self.view.name, message)
        self.items.append(InferResponse(self.rid, error=Error(
            ErrorCode.UNAVAILABLE, message), final=True))
        self.sizes.append(0)
        self._wake()


def all_models_ready(models: dict[str, dict[int, ModelView]]) -> bool:
    """Triton's --strict-readiness rule: every model the server knows has a version,
    and each version is READY or was unloaded on purpose; a failed load, LOADING and
    UNAVAILABLE all make the server not ready."""
    return all(versions and all(v.state == ModelReadyState.READY
                                or v.reason == "unloaded" for v in versions.values())
               for versions in models.values())


class SchedulerDataPlane:
    """The DataPlane (frontend/types.py) over the scheduler's channels: the one object
    a frontend process's transports and endpoints call."""

    _trim: asyncio.TimerHandle | None = None  # the arena's next give-back

    def __init__(self, address: str, scheduler: str, segment_prefix: str, arena_bytes: int,
                 role: str = "frontend", arena_high_water: int | None = None):
        self._failed_at_stop: set[int] = set()  # requests answered at shutdown
        self.address = address
        self.role = role  # how this process names itself in log lines
        self.scheduler = scheduler
        # the inbox it reads when it wakes anyway (LeaseQueue)
        self.quiet_scheduler = done_address(scheduler)
        self.inbox = Inbox(address, FRONTEND_INBOX)
        self.outbox = Outbox()
        self.arena = Arena(segment_prefix, chunk_size=arena_bytes,
                           high_water=arena_high_water)
        self.bodies = BodyBudget()  # arena blocks held for request bodies
        self.body_block_max = self.arena.chunk_size  # a larger body: a segment its own
        self.segments = SegmentCache()
        self.models: dict[str, dict[int, ModelView]] = {}
        self.pending: dict[int, ResponseStream] = {}
        self.laggards = Laggards()  # pending streams whose readers are far behind
        self.waiting = 0  # responses waiting behind each stream's next, in all
        self.calls: dict[int, asyncio.Future] = {}  # shared-memory calls to the scheduler
        # instances lent to this frontend, by (model, version)
        self.leases: dict[tuple[str, int], Lease] = {}
        self._ended: set[int] = set()  # leases over before their grant was heard
        # the client regions registered (the scheduler's table), by name
        self.regions: dict[str, RegionShared] = {}
        self._ids = itertools.count(1)
        self.ready = False
        self.stopping = False
        self.strict_readiness = True
        self.got_state = asyncio.Event()
        self.drain_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.idle = asyncio.Event()
        self.idle.set()
        self.handlers = {
            InferResponse: self.on_response,
            ModelStateUpdate: self.on_model_state,
            ServerState: self.on_server_state,
            Drain: self.on_drain,
            PeerGone: self.on_peer_gone,
            ReleaseBlocks: self.on_release,
            RegionReply: self.on_call_reply,
            StatsReply: self.on_call_reply,
            LogSettingsReply: self.on_call_reply,
            TraceSettingReply: self.on_call_reply,
            RepositoryReply: self.on_call_reply,
            LogSettings: self.on_log_settings,
            LeaseEnded: self.on_lease_ended,
            RegionShared: self.on_region_shared,
            RegionUnshared: self.on_region_unshared,
        }

    def attach(self, loop) -> None:
        self.outbox.loop = loop  # sends never block the loop
        self.inbox.attach(loop, self.handlers)

    # -- DataPlane ----------------------------------------------------------------------

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        if not self.ready or self.stopping:
            return False
        return not self.strict_readiness or all_models_ready(self.models)

    def get_model(self, name: str, version: str = "") -> ModelView:
        versions = self.models.get(name)
        if not versions:
            raise InferError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version:
            v = _version_number(version)
            view = versions.get(v)
            if view is None:
                raise InferError(ErrorCode.NOT_FOUND,
                                 f"Request for unknown model: '{name}' version {v} is not found")
            return view
        ready = [v for v, view in versions.items() if view.state == ModelReadyState.READY]
        if ready:
            return versions[max(ready)]
        # nothing ready: report the most telling entry (a reason, if there is one)
        return versions[max(versions)]

    def model_versions(self, name: str) -> list[ModelView]:
        return [v for _, v in sorted(self.models.get(name, {}).items()) if v.version]

    def body_quota(self) -> BodyQuota:
        """A connection's share of the arena for its request bodies (body_buffer)."""
        return self.bodies.quota()

    def body_buffer(self, nbytes: int, quota: BodyQuota | None = None
                    ) -> tuple[memoryview, tuple[str, int]] | None:
        """A block of this frontend's arena to receive a request body into, counted
        against `quota` (the connection's) and this process's budget until it is freed;
        None when either has no room (the body is then received in process memory)."""
        bodies = self.bodies
        if not bodies.admits(quota, nbytes):
            return None
        segment, offset, view = self.arena.alloc(nbytes)
        bodies.hold((segment, offset), quota, nbytes)
        return view, (segment, offset)

    def free_blocks(self, blocks) -> None:
        bodies = self.bodies.blocks
        for block in blocks:
            self.arena.free(*block)
            if bodies:
                self.bodies.release(block)
        if self._trim is None and self.arena.next_trim() is not None:
            self._trim_later()

    def _trim_later(self) -> None:
        """Give the arena's idle segments back once their time is up (Arena.trim)."""
        self._trim = None
        self.arena.trim()
        wait = self.arena.next_trim()
        if wait is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a unit test): the next free looks again
                return
            self._trim = loop.call_later(wait + 0.05, self._trim_later)

    async def infer(self, request: DecodedRequest, decoupled_refusal: str = "") -> InferResult:
        """One request, one response (the models the unary RPCs serve). A decoupled
        model is refused with `decoupled_refusal` (UNSUPPORTED), each protocol's text."""
        stream = self.start(request, decoupled_refusal)
        result, final = await stream.next()
        while not final:  # not for unary calls: the servers refuse decoupled models
            if isinstance(result, InferResult):
                result.release()
            result, final = await stream.next()
        answer = self._unary_answer(stream, result)
        if isinstance(answer, InferError):
            raise answer
        return answer

    def start_unary(self, request: DecodedRequest, on_done: Callable[[Any], None],
                    decoupled_refusal: str = "") -> ResponseStream:
        """infer() without a coroutine (frontend/types.py): the final response is
        handed to `on_done` from the callback that reads it, where infer() costs a
        task, a future, and four coroutine frames resumed in turn (HTTP's fast path)."""
        stream = self.start(request, decoupled_refusal)
        stream.on_done = on_done
        return stream

    def _unary_answer(self, stream: ResponseStream, result):
        """What a unary call answers for its final response: the InferResult (handed
        to the cache if it missed there), or an InferError."""
        if isinstance(result, InferError):
            return result
        if result is None:
            return InferError(ErrorCode.INTERNAL,
                              f"model '{stream.view.name}' sent no response")
        if stream.key and not result.cache_hit:
            self._cache_insert(stream.key, stream.view, result)
        return result

    def start(self, request: DecodedRequest, decoupled_refusal: str = "") -> ResponseStream:
        """Validate `request` and send it to the scheduler; its responses come through
        the returned stream. Raises InferError for a request refused before it ran
        (with `decoupled_refusal` set, a decoupled model is refused with that text)."""
        try:
            view, batch_size = self._admit(request, decoupled_refusal)
            refs, blocks = put_inputs(self.arena, request.inputs)
        except BaseException:
            self.free_blocks(request.arena_blocks)
            raise
        blocks.extend(request.arena_blocks)
        params = request.parameters
        outputs = None
        if request.outputs is not None:
            outputs = [RequestedOutput(o.name, o.parameters, _output_target(o))
                       for o in request.outputs]
        key = None
        if view.cache and not (outputs and any(o.target for o in outputs)):
            # client-region inputs give None here: this process cannot read them
            # "every output" is the config's outputs, so that it keys as listing them
            wanted = request.outputs if request.outputs is not None else view.cache_outputs
            key = cache_key(view.name, view.version, request.inputs, wanted)
        rid = next(self._ids)
        if not self.pending:
            self.idle.clear()
        stream = self.pending[rid] = ResponseStream(self, rid, view, request, blocks, key)
        if params:
            req = InferRequest(
                rid, self.address, view.name, view.version, refs, outputs,
                request_id=request.id,
                batch_size=batch_size or 1,
                priority=int(params.get("priority", 0) or 0),
                timeout_us=int(params.get("timeout", 0) or 0),
                sequence_id=params.get("sequence_id", 0) or 0,
                sequence_start=bool(params.get("sequence_start", False)),
                sequence_end=bool(params.get("sequence_end", False)),
                parameters=_user_parameters(params),
                start_ns=time.monotonic_ns(),  # Triton's request start: parsed and valid
                cache_key=key or b"",
            )
        else:  # the usual request: no parameters, every field its default (a call of
            # its own: one with **fields, made empty here, costs ~0.9 us more in msgspec)
            req = InferRequest(rid, self.address, view.name, view.version, refs, outputs,
                               request_id=request.id, batch_size=batch_size or 1,
                               start_ns=time.monotonic_ns(), cache_key=key or b"")
        lease = self.leases.get((view.name, view.version)) if self.leases else None
        if lease is not None and len(lease.inflight) < lease.depth and goes_direct(req) \
                and (direct := self._bound(req)) is not None:
            req = direct
            # behind another of its requests (a deep lease): it waits at the worker as
            # in a queue, where a cancel still takes it out (workers/waiting.py); its
            # batch id is its request id, which names it there
            ahead = bool(lease.inflight)
            lease.inflight.add(rid)
            stream.direct = lease.address
            self.outbox.send(lease.address, ExecuteBatch(rid, lease.instance, [req],
                                                         quiet=True, lease=lease.id,
                                                         direct=True, ahead=ahead))
            if ahead:
                self._tell_waiting(lease)
        else:
            self.outbox.send(self.scheduler, req)
        return stream

    def _cache_insert(self, key: bytes, view: ModelView, result: InferResult) -> None:
        """A miss ran: hand its outputs to the scheduler's cache, once. Outputs in the
        worker's arena are copied out (the cache outlives the block); inline ones are
        the bytes already received."""
        outputs = []
        for out in result.outputs:
            if out.data is None:
                return  # written into a client region: nothing to cache
            data = out.data if isinstance(out.data, bytes) else bytes(out.data)
            outputs.append(TensorRef(out.name, out.datatype, out.shape, data=data))
        self.outbox.send(self.scheduler, CacheInsert(key, view.name, view.version, outputs))

    def _admit(self, request: DecodedRequest, decoupled_refusal: str = ""):
        if self.stopping:
            raise InferError(ErrorCode.UNAVAILABLE, "Server is stopping")
        view = self.get_model(request.model_name, request.model_version)
        if decoupled_refusal and view.decoupled:
            raise InferError(ErrorCode.UNSUPPORTED, decoupled_refusal)
        if view.state != ModelReadyState.READY:
            raise not_ready_error(view, request.model_version)
        checked = request.checked
        if checked is not None and checked[0] is view.config:
            return view, checked[1]
        batch_size = validate_request(request, view.config)
        request.checked = (view.config, batch_size)
        if request.memo is not None:  # for the next request decoded alike
            request.memo.keep(request)
        return view, batch_size

    # -- tensors ------------------------------------------------------------------------

    def _result(self, view: ModelView, request: DecodedRequest, resp: InferResponse):
        outputs = []
        held = []
        for ref in resp.outputs:
            if ref.region:  # written into the client's region: nothing to send
                outputs.append(OutputTensor(ref.name, ref.datatype, ref.shape, None))
                continue
            if ref.data is not None:
                data = ref.data
            else:
                data = self.segments.view(ref.segment, ref.offset, ref.nbytes)
                held.append((ref.segment, ref.offset))
            outputs.append(OutputTensor(ref.name, ref.datatype, ref.shape, data))
        result = InferResult(view.name, str(view.version), request.id, outputs,
                             parameters=resp.parameters, cache_hit=resp.cache_hit)
        if held:
            owner, outbox, reader = resp.owner, self.outbox, self.address
            result.release = lambda: outbox.send(owner, ReleaseBlocks(reader, held))
        return result

    # -- shared-memory calls -----------------------------------------------------------

    async def shm_call(self, op: str, kind: str, *, name: str = "", key: str = "",
                       offset: int = 0, byte_size: int = 0, device_id: int = 0,
                       raw_handle: bytes = b"") -> list:
        reply: RegionReply = await self._call(lambda call_id: RegionRequest(
            call_id, self.address, RegionOp(op), kind, name, key, offset, byte_size,
            device_id, raw_handle))
        return reply.regions

    async def model_statistics(self, name: str = "", version: str = "") -> bytes:
        """The statistics extension's JSON, as the scheduler counts it."""
        v = _version_number(version) if version else -1
        reply: StatsReply = await self._call(
            lambda call_id: StatsRequest(call_id, self.address, name, v))
        return reply.body

    async def log_settings(self, update: dict | None = None) -> LogSettings:
        """The logging extension: the settings in force after applying `update` (None:
        just read them). Values as the client sent them; the scheduler validates."""
        reply: LogSettingsReply = await self._call(
            lambda call_id: LogSettingsRequest(call_id, self.address, update))
        return reply.settings

    async def trace_settings(self, model: str = "", update: dict | None = None) -> dict:
        """The trace extension: global (`model` empty) or a model's settings in force
        after applying `update` (None: just read them), as Triton's HTTP JSON."""
        reply: TraceSettingReply = await self._call(
            lambda call_id: TraceSettingRequest(call_id, self.address, model, update))
        return reply.settings

    # -- the model-repository extension -------------------------------------------------
    # No timeout on these: a load runs as long as the model's instances take to start.

    async def repository_index(self, ready: bool = False) -> list[IndexEntry]:
        reply: RepositoryReply = await self._call(
            lambda call_id: RepositoryRequest(call_id, self.address, RepositoryOp.INDEX,
                                              ready=ready))
        return reply.models

    async def repository_load(self, name: str, config: str | None = None,
                              files: dict[str, bytes] | None = None) -> None:
        await self._call(lambda call_id: RepositoryRequest(
            call_id, self.address, RepositoryOp.LOAD, name, config=config,
            files=files or {}))

    async def repository_unload(self, name: str, unload_dependents: bool = False) -> None:
        await self._call(lambda call_id: RepositoryRequest(
            call_id, self.address, RepositoryOp.UNLOAD, name,
            unload_dependents=unload_dependents))

    async def _call(self, make):
        """Send the control call `make(call_id)` to the scheduler and wait for its
        reply; a reply that carries an error raises it."""
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.calls[call_id] = fut
        self.outbox.send(self.scheduler, make(call_id))
        try:
            reply = await fut
        finally:
            self.calls.pop(call_id, None)
        if reply.error is not None:
            error = reply.error
            raise InferError(error.code or ErrorCode.INTERNAL, error.message)
        return reply

    def on_call_reply(self, msg) -> None:
        fut = self.calls.get(msg.call_id)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    # -- messages from the scheduler and workers -------------------------------------

    def on_response(self, msg: InferResponse) -> None:
        stream = self.pending.get(msg.id)
        if stream is None:
            self._release_unclaimed(msg)
            return
        if msg.lease is not None:
            self._leased(stream.view, *msg.lease)
        if msg.final and stream.direct:
            lease = self.leases.get((stream.view.name, stream.view.version))
            if lease is not None:
                lease.inflight.discard(msg.id)
                if lease.told:
                    self._tell_waiting(lease)
        if msg.final:
            # the request has ended: the worker reads its inputs no more
            del self.pending[msg.id]
            self.free_blocks(stream.blocks)
            if not self.pending:
                self.idle.set()
        elif msg.empty:
            return  # a placeholder the scheduler relayed for preserve_ordering
        stream._deliver(msg)

    def _bound(self, req: InferRequest) -> InferRequest | None:
        """`req` with the client regions it names resolved here, as the scheduler
        would (a copy); None if one is unknown here or out of its bounds: the
        scheduler then answers it (NOT_FOUND, INVALID_ARG) in its own words."""
        named = any(ref.region == -1 for ref in req.inputs) or bool(
            req.outputs and any(o.target is not None for o in req.outputs))
        if not named:
            return req
        inputs = []
        for ref in req.inputs:
            if ref.region == -1 and (ref := self._bind(ref)) is None:
                return None
            inputs.append(ref)
        outputs = req.outputs
        if outputs:
            outputs = []
            for out in req.outputs:
                if out.target is not None:
                    target = self._bind(out.target)
                    if target is None:
                        return None
                    out = RequestedOutput(out.name, out.parameters, target)
                outputs.append(out)
        return msgspec.structs.replace(req, inputs=inputs, outputs=outputs)

    def _bind(self, ref: TensorRef) -> TensorRef | None:
        region = self.regions.get(ref.segment)
        if region is None or not in_bounds(ref, region.byte_size):
            return None
        ref = msgspec.structs.replace(ref)
        bind(ref, region)
        return ref

    def on_region_shared(self, msg: RegionShared) -> None:
        self.regions[msg.name] = msg

    def on_region_unshared(self, msg: RegionUnshared) -> None:
        self.regions.pop(msg.name, None)

    def _tell_waiting(self, lease: Lease) -> None:
        """The scheduler counts what waits at the worker under a deep lease as pending:
        tell it when that changes (its quiet inbox; the writes of a pass go together)."""
        waiting = max(len(lease.inflight) - 1, 0)
        if waiting != lease.told:
            lease.told = waiting
            self.outbox.send(self.quiet_scheduler, LeaseQueue(lease.instance, lease.id,
                                                              waiting))

    def _leased(self, view: ModelView, lease_id: int, instance: str, address: str,
                depth: int = 1) -> None:
        if lease_id in self._ended:
            self._ended.discard(lease_id)
            return
        self.leases[(view.name, view.version)] = Lease(lease_id, instance, address, depth)

    def on_lease_ended(self, msg: LeaseEnded) -> None:
        """A lease is over: requests go to the scheduler again. Those sent under it
        that still run are lost with its instance (`lost`) and fail. Any other not
        answered yet either runs (the worker ended the lease after what it had read),
        or the worker had not read it: it hands it on to the scheduler and then says
        so for that request (a LeaseEnded naming it), or it stops first, and the
        request fails when its PeerGone comes (on_peer_gone)."""
        lease = None
        for key, held in self.leases.items():
            if held.id == msg.lease:
                lease = self.leases.pop(key)
                break
        if lease is not None:  # the first word of its end (the worker's may cross)
            for rid in sorted(lease.inflight):
                stream = self.pending.get(rid)
                if stream is None:
                    continue
                if msg.lost:
                    self.on_response(InferResponse(rid, error=Error(
                        ErrorCode.UNAVAILABLE, msg.reason)))
                else:
                    stream.handing = lease.id
        if msg.request:
            stream = self.pending.get(msg.request)
            if stream is not None and stream.handing == msg.lease:
                stream.direct, stream.handing = "", 0  # handed on: the scheduler's now
        elif lease is None:  # before the answer that granted it (another connection)
            if len(self._ended) >= ENDED_MAX:
                self._ended.clear()
            self._ended.add(msg.lease)

    def _release_unclaimed(self, msg: InferResponse) -> None:
        blocks = [(r.segment, r.offset) for r in msg.outputs if r.data is None]
        if blocks and msg.owner:
            self.outbox.send(msg.owner, ReleaseBlocks(self.address, blocks))

    def on_model_state(self, msg: ModelStateUpdate) -> None:
        config = model_config_pb2.ModelConfig()
        if msg.config:
            config.ParseFromString(msg.config)
        view = ModelView(msg.name, msg.version, msg.state, msg.reason, config,
                         cache=msg.cache, labels=msg.labels or None,
                         decoupled=config.model_transaction_policy.decoupled)
        if msg.cache:
            # "every output" keys as listing the config's outputs
            view.cache_outputs = list(config.output) or None
        if msg.config_json:
            view.config_json = json.loads(msg.config_json)
        self.models.setdefault(msg.name, {})[msg.version] = view
        self.leases.pop((msg.name, msg.version), None)  # the scheduler's to lend again
        if msg.version:  # a real version supersedes a placeholder for a failed config
            self.models[msg.name].pop(0, None)

    def on_log_settings(self, msg: LogSettings) -> None:
        apply_log_settings(self.role, msg)

    def on_server_state(self, msg: ServerState) -> None:
        self.ready = msg.ready
        self.strict_readiness = msg.strict
        self.stopping = self.stopping or msg.stopping
        self.got_state.set()

    def on_drain(self, msg: Drain) -> None:
        self.stopping = True
        if not self.drain_requested.done():
            self.drain_requested.set_result(msg.timeout_s)

    def on_drain_signal(self) -> None:
        """SIGTERM from the supervisor: stop now, waiting for nothing."""
        self.on_drain(Drain(0.0))

    def on_peer_gone(self, msg: PeerGone) -> None:
        # A worker that stopped (its model unloaded) after a request was sent to it
        # under a lease, but before it read it (its lease over or not): nobody else
        # will answer that one
        for key in [k for k, lease in self.leases.items() if lease.address == msg.address]:
            del self.leases[key]
        for rid, stream in list(self.pending.items()):
            if stream.direct == msg.address:
                self.on_response(InferResponse(rid, error=Error(
                    ErrorCode.UNAVAILABLE, f"model '{stream.view.name}' stopped before "
                    "it ran the request")))
        self.outbox.drop(msg.address)
        self.segments.forget(msg.segment_prefix)

    def on_release(self, msg: ReleaseBlocks) -> None:
        self.free_blocks([(segment, offset) for segment, offset in msg.blocks])

    def fail_pending(self) -> None:
        """Answer every request still waiting with an error, so that their HTTP and
        gRPC handlers return now: the servers' shutdown waits for open handlers, and a
        client whose scheduler died must not wait on that."""
        failed = self._failed_at_stop
        for rid, stream in list(self.pending.items()):
            if rid in failed:
                continue  # answered by an earlier call: once is enough
            failed.add(rid)
            stream._deliver(InferResponse(
                stream.rid, error=Error(ErrorCode.UNAVAILABLE, "Server is stopping")))

    def close(self) -> None:
        self.fail_pending()
        for fut in self.calls.values():
            if not fut.done():
                fut.set_exception(InferError(ErrorCode.UNAVAILABLE, "Server is stopping"))
        held = self.arena.used_bytes()
        if held and not self.pending:  # every request ended: its input blocks are free
            log.warning("%s: %d bytes of arena blocks still in use at exit", self.role,
                        held)
        if self._trim is not None:
            self._trim.cancel()
        self.laggards.close()
        self.segments.close()
        self.arena.close()
        self.inbox.close()
        self.outbox.close()


def put_inputs(arena: Arena, inputs) -> tuple[list[TensorRef], list[tuple[str, int]]]:
    """Descriptors for a request's inputs: small ones inline, large ones copied once into
    a block of `arena`. Returns the descriptors and the blocks to free afterwards."""
    refs, blocks = [], []
    try:
        _describe_inputs(arena, inputs, refs, blocks)
    except BaseException:
        for segment, offset in blocks:
            arena.free(segment, offset)
        raise
    return refs, blocks


def _describe_inputs(arena: Arena, inputs, refs: list, blocks: list) -> None:
    for inp in inputs:
        data = inp.data
        if data is None:  # in a client's region: the scheduler resolves the name
            refs.append(_region_ref(inp.name, inp.datatype, inp.shape, inp.parameters))
            continue
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n <= INLINE_MAX:
            refs.append(TensorRef(inp.name, inp.datatype, inp.shape, data=bytes(data)))
            continue
        where = arena.locate(data)
        if where is not None:  # received straight into shared memory: no copy at all
            segment, offset = where
        else:
            segment, offset, view = arena.alloc(n)
            view[:] = data  # the one copy of this input: request body -> shared memory
            blocks.append((segment, offset))
        refs.append(TensorRef(inp.name, inp.datatype, inp.shape, segment=segment,
                              offset=offset, nbytes=n))


def _region_ref(name: str, datatype: str, shape, params: dict) -> TensorRef:
    """A tensor in a client region, by the region's name (validate_request has checked
    the shared_memory_* parameters); the scheduler resolves and bounds-checks it."""
    return TensorRef(name, datatype, shape, segment=params["shared_memory_region"],
                     offset=params.get("shared_memory_offset", 0),
                     nbytes=params["shared_memory_byte_size"], region=-1)


def _output_target(out) -> TensorRef | None:
    """The client region an output must be written into, if the request names one."""
    p = out.parameters
    if not p or "shared_memory_region" not in p:
        return None
    return _region_ref(out.name, "", [], p)


_CONTROL_PARAMETERS = {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                       "binary_data_output", "headers",
                       # Triton's own: read by the stream handlers, not the model's
                       "triton_enable_empty_final_response"}


def _user_parameters(params: dict) -> dict:
    if not params:
        return {}
    return {k: v for k, v in params.items() if k not in _CONTROL_PARAMETERS}


def _version_number(version: str) -> int:
    """A version as a URL or a gRPC field spells it (Triton's words for a bad one)."""
    try:
        return int(version)
    except ValueError:
        raise InferError(ErrorCode.INVALID_ARG,
                         f"failed to get model version from specified version string "
                         f"'{version}' (details: stol), version should be an integral "
                         "value > 0") from None

