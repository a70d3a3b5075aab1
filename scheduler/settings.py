"""The server-wide calls the loop answers at once: the logging and trace extensions'
settings, and the statistics extension. Each is one entry of the loop's dispatch
table; an InferError a call raises goes back as its reply's error."""

from __future__ import annotations

import logging
from typing import Callable, Iterable

import orjson

from scheduler import log_settings
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.repository.models import ModelReadyState
from scheduler.trace import TraceManager
from shm.errors import ErrorCode, InferError
from shm.log import configure_logging
from shm.messages.frontend import StatsReply, StatsRequest
from shm.messages.results import Error
from shm.messages.settings import (LogSettings, LogSettingsReply, LogSettingsRequest,
                                   TraceSettingReply, TraceSettingRequest)

log = logging.getLogger("shmserve.scheduler")


class SettingsCalls:
    """`send(address, reply)` answers; `broadcasts` tell every child process new log
    settings (the frontend and worker pools)."""

    def __init__(self, args, trace: TraceManager, manager: ModelRepositoryManager,
                 send: Callable[[str, object], None],
                 broadcasts: Iterable[Callable[[LogSettings], None]]):
        self.args = args
        self.trace = trace
        self.manager = manager
        self._send = send
        self._broadcasts = tuple(broadcasts)

    def _answer(self, call, reply, fill) -> None:
        """Answer a call: `fill(reply)` sets its result, or the InferError it raises
        goes back as the reply's error."""
        try:
            fill(reply)
        except InferError as exc:
            reply.error = Error(exc.code, exc.message)
        self._send(call.reply_to, reply)

    def on_stats(self, call: StatsRequest) -> None:
        def fill(reply):
            reply.body = orjson.dumps(self.manager.statistics(call.model, call.version))
        self._answer(call, StatsReply(call.call_id), fill)

    def on_log_settings(self, call: LogSettingsRequest) -> None:
        def fill(reply):
            if call.update is not None:
                new = log_settings.apply_update(self.args.log_settings, call.update)
                if new != self.args.log_settings:
                    # children started from now on get these (the pools read args)
                    self.args.log_settings = new
                    configure_logging("scheduler", new)
                    for broadcast in self._broadcasts:
                        broadcast(new)
                    log.info("log settings updated: %s", new)
            reply.settings = self.args.log_settings
        self._answer(call, LogSettingsReply(call.call_id), fill)

    def on_trace_setting(self, call: TraceSettingRequest) -> None:
        def fill(reply):
            if call.model:
                mv = self.manager.models.resolve(call.model, 0)
                if mv is None or mv.state is not ModelReadyState.READY:
                    raise InferError(ErrorCode.INVALID_ARG,
                                     f"Request for unknown model : {call.model}")
            if call.update is not None:
                self.trace.update(call.model, call.update)
                if self.trace.active:  # requests sent under a lease would not be seen
                    for sched in self.manager.instance_schedulers():
                        sched.end_leases()
            reply.settings = self.trace.settings(call.model)
        self._answer(call, TraceSettingReply(call.call_id), fill)
