"""Server-wide settings calls: the logging and trace extensions.

Frontends forward GET/POST to the scheduler as a settings call (`update` None for a
GET), with the values as the client sent them (bool/int/str/list/None); the scheduler
validates, applies and answers with the settings now in force. Log settings are then
broadcast to every frontend and worker as `LogSettings`.
"""

from __future__ import annotations

import msgspec

from shm.messages.results import Error


class LogSettings(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                  frozen=True):
    """The log settings every process applies (Triton's logging extension names).
    Also handed to each child at spawn (JSON on its command line), so a process
    restarted later logs as the others do."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"  # "default" or "ISO8601"


class LogSettingsRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                         frozen=True):
    """GET (`update` None) or POST /v2/logging, gRPC LogSettings."""

    call_id: int
    reply_to: str
    update: dict | None = None


class LogSettingsReply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    call_id: int
    error: Error | None = None
    settings: LogSettings | None = None


class TraceSettingRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                          frozen=True):
    """GET (`update` None) or POST /v2[/models/{model}]/trace/setting, gRPC
    TraceSetting. A value None clears a setting (it falls back again)."""

    call_id: int
    reply_to: str
    model: str = ""
    update: dict | None = None


class TraceSettingReply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    """`settings` as Triton's HTTP endpoint answers: every value a string, except
    trace_level, a list of strings."""

    call_id: int
    error: Error | None = None
    settings: dict[str, str | list[str]] = {}
