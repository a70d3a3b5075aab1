"""The logging extension's settings: from the command line, and updated by clients.

The scheduler owns them; after a valid update it applies them to itself and broadcasts
them to every frontend and worker (shm.log.configure_logging does the applying).
"""

from __future__ import annotations

import msgspec

from shm.errors import ErrorCode, InferError
from shm.messages.settings import LogSettings

LOG_FORMATS = ("default", "ISO8601")
_BOOLS = ("log_info", "log_warning", "log_error")
_UINT32_MAX = 2**32 - 1


def from_args(args) -> LogSettings:
    return LogSettings(log_file=args.log_file or "", log_info=args.log_info,
                       log_warning=args.log_warning, log_error=args.log_error,
                       log_verbose_level=args.log_verbose, log_format=args.log_format)


def apply_update(current: LogSettings, update: dict) -> LogSettings:
    """`current` with the client's `update` applied, or InferError and nothing changed.

    As Triton: settings not named stay as they are, a null value changes nothing, names
    it does not know are ignored, and the log file cannot be moved over the network.
    Unlike Triton (which applies settings one by one and may stop half way), every
    value is checked before any is applied."""
    changes = {}
    if update.get("log_file") is not None:
        raise InferError(ErrorCode.UNSUPPORTED,
                         "log file location can not be updated through network protocol")
    for name in _BOOLS:
        value = update.get(name)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"expect boolean for '{name}', got {value!r}")
        changes[name] = value
    level = update.get("log_verbose_level")
    if level is not None:
        if isinstance(level, bool) or not isinstance(level, int):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"expect unsigned integer for 'log_verbose_level', "
                             f"got {level!r}")
        if not 0 <= level <= _UINT32_MAX:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"'log_verbose_level' must be in [ 0, {_UINT32_MAX} ], "
                             f"got {level}")
        changes["log_verbose_level"] = level
    fmt = update.get("log_format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"expect string for 'log_format', got {fmt!r}")
        if fmt not in LOG_FORMATS:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"invalid argument for log_format, got: {fmt}")
        changes["log_format"] = fmt
    return msgspec.structs.replace(current, **changes) if changes else current

