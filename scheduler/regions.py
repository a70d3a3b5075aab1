"""The registry of client shared-memory regions (system and CUDA), in the scheduler.

Every register, status and unregister call of every frontend comes here, so there is
one table and no frontend can race another. A request names regions; `resolve` checks
them when it arrives and turns each name into what a worker needs (the POSIX key or the
CUDA IPC handle, and the registration's uid), and the request counts as a user of its
regions until it finishes. Unregistering a region takes its name away at once; the
call is answered, and workers told to unmap, once its last user has finished. (Triton
2.51 refuses to unregister a region in use. Here a response reaches its client straight
from the worker, before the scheduler hears that the batch is done, so a client that
unregisters right after its answer would be refused at random: waiting is the answer
that is always right. tests/e2e/test_error_table.py lists it.)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from typing import Callable, Iterable

from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest
from shm.messages.regions import (CUDA, CUDA_IPC_HANDLE_BYTES, SYSTEM, RegionOp,
                                  RegionReply, RegionRequest, RegionShared, RegionStatus,
                                  RegionUnshared, bind, in_bounds)
from shm.messages.results import Error
from shm.regions import NotSharedMemory, check_client_key, object_size
from shm.tensor import TensorRef

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Region:
    """A registration: `info`, what workers map and frontends are told (RegionShared;
    its fields read through: `region.name`, `region.key`...), and who uses it."""

    info: RegionShared
    users: int = 0
    # unregister calls waiting for the last user: callbacks run when it is gone
    waiters: list = dataclasses.field(default_factory=list)
    gone: bool = False

    def status(self) -> RegionStatus:
        return RegionStatus(self.name, self.kind, self.key, self.offset, self.byte_size,
                            self.device_id)


# `info`'s fields, read through as properties: a __getattr__ fallback costs a failed
# lookup each time, and resolve() reads five or six of them per region a request uses
# (6-8 us against 0.4-0.6 per reference on the 2-core VM)
for _field in RegionShared.__struct_fields__:
    setattr(Region, _field, property(operator.attrgetter(f"info.{_field}")))
del _field


class RegionRegistry:
    def __init__(self, allowed: bool, cuda_devices: int,
                 on_gone: Callable[[Region], None],
                 send: Callable[[str, RegionReply], None] | None = None):
        self.allowed = allowed
        self._send = send  # answers a call (the loop's outbox)
        self.cuda_devices = cuda_devices
        self.on_gone = on_gone  # a region's last user finished after it was unregistered
        # frontends hear of every region (RegionShared, RegionUnshared); the loop's
        # leases: the ids of those out, and a call that asks for them all back
        self.publish: Callable[[object], None] = lambda msg: None
        self.leases: Callable[[], list[int]] = list
        self.end_leases: Callable[[], None] = lambda: None
        self.by_name: dict[str, Region] = {}
        self._uids = itertools.count(1)
        # request (reply_to, id) -> the regions it uses
        self.users: dict[tuple[str, int], list[Region]] = {}
        # unregistered regions that requests still use: while there is one, the loop
        # reads every batch's end as it comes (server.py's _watch_done), since the
        # unregister call waits for it; otherwise the ends of batches that use regions
        # may wait for the loop's next wake like any other
        self.draining: set[Region] = set()

    # -- calls ------------------------------------------------------------------------

    def on_call(self, call: RegionRequest) -> None:
        """A frontend's shared-memory call, from the loop's dispatch table. An
        unregister is answered once no request uses the region(s) any more."""
        def answer(error: InferError | None = None, regions=()) -> None:
            reply = RegionReply(call.call_id, regions=list(regions))
            if error is not None:
                reply.error = Error(error.code, error.message)
            self._send(call.reply_to, reply)

        try:
            match call.op:
                case RegionOp.REGISTER:
                    self.register(call)
                    log.info("registered %s shared memory region '%s'", call.kind,
                             call.name)
                    answer()
                case RegionOp.STATUS:
                    answer(regions=self.status(call.kind, call.name))
                case RegionOp.UNREGISTER:
                    self.unregister(call.kind, call.name, answer)
        except InferError as exc:
            answer(exc)

    def quarantine(self, requests: Iterable[InferRequest]) -> list[str]:
        """A worker died of SIGBUS running `requests`: a client truncated the object
        of a system region while something read it through a mapping. Those regions
        are unregistered (their client's later requests fail); returns their names."""
        faulted = sorted({region.name for req in requests
                          for region in self.users.get((req.reply_to, req.id), ())
                          if region.kind == SYSTEM and not region.gone})
        for name in faulted:
            log.warning("system shared memory region '%s' faulted a worker (its object "
                        "was truncated while in use); unregistered it", name)
            self.unregister(SYSTEM, name, lambda *_: None)
        return faulted

    def register(self, call: RegionRequest) -> None:
        self._check_allowed(call.kind)
        if not call.name:
            raise InferError(ErrorCode.INVALID_ARG, "shared memory region name must not be empty")
        if call.name in self.by_name:
            raise InferError(ErrorCode.ALREADY_EXISTS,
                             f"shared memory region '{call.name}' already in manager")
        if call.byte_size <= 0 and call.kind != SYSTEM:
            raise _empty_region(call.name)
        place = {}  # where it lies: key and offset, or device and IPC handle
        if call.kind == SYSTEM:
            try:
                check_client_key(call.key)
            except ValueError as exc:
                raise InferError(ErrorCode.INVALID_ARG, str(exc)) from None
            try:
                size = object_size(call.key)
            except NotSharedMemory:
                # opened without blocking (a FIFO would wait for a writer) and refused:
                # Triton's text and status when its mmap of such a file fails
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"failed to register shared memory region "
                                 f"'{call.name}': invalid args") from None
            except OSError as exc:
                # Triton 2.51: status 500 / INTERNAL and no reason (shm_open's errno
                # goes to its verbose log only): a missing key, or a symlink
                # (O_NOFOLLOW, as glibc's shm_open); ours goes to the log too
                log.info("shared memory key %r: %s", call.key, exc.strerror)
                raise InferError(ErrorCode.INTERNAL,
                                 f"Unable to open shared memory region: '{call.key}'") \
                    from None
            if call.offset < 0 or call.offset + call.byte_size > size:
                log.info("shared memory region %r: offset %d + byte size %d exceeds "
                         "the %d bytes of %r", call.name, call.offset, call.byte_size,
                         size, call.key)
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"failed to register shared memory region '{call.name}':"
                                 " invalid args")
            if call.byte_size <= 0:  # after the bounds, as Triton (offset 65 of 64: bounds)
                raise _empty_region(call.name)
            place = dict(key=call.key, offset=call.offset)
        else:
            if not self.cuda_devices:
                # Triton 2.51 without a GPU: 400 and these words (its cudaIpcOpenMemHandle
                # fails); why goes to the log
                log.info("CUDA shared memory region %r refused: this server sees no CUDA "
                         "device", call.name)
                raise InferError(ErrorCode.INVALID_ARG,
                                 "failed to register shared memory region: invalid args")
            if not 0 <= call.device_id < self.cuda_devices:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"failed to register CUDA shared memory region "
                                 f"'{call.name}': no CUDA device {call.device_id} "
                                 f"(this server sees {self.cuda_devices})")
            if len(call.raw_handle) != CUDA_IPC_HANDLE_BYTES:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"CUDA shared memory region '{call.name}': raw handle "
                                 f"must be {CUDA_IPC_HANDLE_BYTES} bytes, got "
                                 f"{len(call.raw_handle)}")
            place = dict(device_id=call.device_id, raw_handle=call.raw_handle)
        region = Region(RegionShared(next(self._uids), call.name, call.kind,
                                     byte_size=call.byte_size, **place))
        self.by_name[call.name] = region
        self.publish(region.info)

    def status(self, kind: str, name: str) -> list[RegionStatus]:
        # Triton answers status even with client shm disabled (there is none to list)
        self._check_allowed(kind, status=True)
        if name:
            region = self.by_name.get(name)
            if region is None or region.kind != kind:
                raise InferError(ErrorCode.NOT_FOUND,
                                 f"Unable to find {_what(kind)} region: '{name}'")
            return [region.status()]
        # in name order, as Triton's (its regions are a std::map by name; clients and
        # tests that compare the list see the same order from both servers)
        return [r.status() for _, r in sorted(self.by_name.items()) if r.kind == kind]

    def unregister(self, kind: str, name: str, done: Callable[[], None]) -> None:
        """Take the region(s) away; `done` runs once none is in use any more (maybe now).
        An unknown name is no error (Triton's)."""
        self._check_allowed(kind)
        if name:
            region = self.by_name.get(name)
            regions = [region] if region is not None and region.kind == kind else []
        else:
            regions = [r for r in self.by_name.values() if r.kind == kind]
        # Requests a frontend sends under a lease resolved the names in the frontend and
        # are nobody's users here: every lease is taken back, and each counts as a user
        # of these regions until its worker says it is over, after the last request
        # sent under it (RequestCalls.on_lease_ended)
        leases = self.leases() if regions else []
        if leases:
            for r in regions:
                r.users += len(leases)
            for lease in leases:
                self.users.setdefault(("lease", lease), []).extend(regions)
            self.end_leases()
        pending = [r for r in regions if r.users]
        for r in regions:
            del self.by_name[r.name]
            self.publish(RegionUnshared(r.name))
            r.gone = True
            if not r.users:
                self.on_gone(r)
        if not pending:
            done()
            return
        remaining = [len(pending)]

        def one_finished() -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                done()

        for r in pending:
            r.waiters.append(one_finished)
            self.draining.add(r)

    def _check_allowed(self, kind: str, status: bool = False) -> None:
        if kind not in (SYSTEM, CUDA):
            raise InferError(ErrorCode.INVALID_ARG, f"unknown shared memory kind '{kind}'")
        if status:
            return
        if not self.allowed:  # Triton's kClientShmDisabledErrorStr, code and words
            raise InferError(ErrorCode.UNSUPPORTED,
                             "Client shared memory is disabled. Start the server with "
                             "'--allow-client-shm=true' to enable.")

    # -- requests ---------------------------------------------------------------------

    def resolve(self, req: InferRequest) -> None:
        """Turn the region names `req` uses into what workers map, check the bounds,
        and count `req` as their user. Raises InferError (the request fails)."""
        used: list[Region] = []
        for ref in req.inputs:
            if ref.region == -1:
                used.append(self._resolve(ref, f"input '{ref.name}'"))
        if req.outputs:
            for out in req.outputs:
                if out.target is not None and out.target.region == -1:
                    used.append(self._resolve(out.target, f"output '{out.name}'"))
        if used:
            for r in used:
                r.users += 1
            self.users[(req.reply_to, req.id)] = used

    def _resolve(self, ref: TensorRef, what: str) -> Region:
        region = self.by_name.get(ref.segment)
        if region is None:  # Triton 2.51: 404 / NOT_FOUND
            raise InferError(ErrorCode.NOT_FOUND,
                             f"Unable to find shared memory region: '{ref.segment}'")
        info = region.info  # read once: what bind() and the bounds need
        if not in_bounds(ref, info.byte_size):
            # Triton's texts, word for word (its qa tests match on them): an offset
            # past the region's last byte is named alone, else the sum is; a negative
            # offset is a huge one to Triton (size_t). The numbers go to the log.
            log.info("%s: offset %d + byte size %d > the %d bytes of region '%s'", what,
                     ref.offset, ref.nbytes, region.byte_size, region.name)
            which = ("offset" if ref.offset < 0 or ref.offset >= region.byte_size
                     else "offset + byte size")
            raise InferError(ErrorCode.INVALID_ARG,
                             f"Invalid {which} for shared memory region: '{region.name}'")
        bind(ref, info)
        return region

    def finished(self, req: InferRequest) -> None:
        """`req` is done (answered, failed or dropped): it no longer uses its regions."""
        if self.users:
            self._release((req.reply_to, req.id))

    def lease_over(self, lease: int) -> None:
        """A lease that an unregister waited for has ended: what its frontend sent
        under it has run (see unregister)."""
        if self.users:
            self._release(("lease", lease))

    def _release(self, user) -> None:
        used = self.users.pop(user, None)
        if not used:
            return
        for r in used:
            r.users -= 1
            if r.gone and not r.users:
                self.draining.discard(r)
                self.on_gone(r)
                waiters, r.waiters = r.waiters, []
                for w in waiters:
                    w()


def _what(kind: str) -> str:
    return "system shared memory" if kind == SYSTEM else "cuda shared memory"  # Triton's


def _empty_region(name: str) -> InferError:
    # Triton's words (its mmap of 0 bytes fails with EINVAL), checked on 2.51
    return InferError(ErrorCode.INVALID_ARG, f"failed to register shared memory region "
                                             f"'{name}': unable to process address "
                                             "spaceInvalid argument")
