"""How every process logs: Triton's line layout, its level switches, one shared file.

`configure_logging(role, settings)` is called once at start and again whenever the
scheduler broadcasts new LogSettings, so a change made through the logging extension
reaches every process. With `log_file` set, every process appends to that one file
(records are written and flushed one line at a time, so lines do not tear).
"""

from __future__ import annotations

import logging
import os
import sys
import time

from shm.messages.settings import LogSettings

_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
           logging.CRITICAL: "E"}  # Triton prints verbose lines as "I" too


class TritonFormatter(logging.Formatter):
    """Triton's two layouts, with the process role beside the pid (several processes
    share one log):

    default: `I1124 10:12:15.123456 4242 frontend[0] core.py:88] message`
    ISO8601: `2026-11-24T10:12:15Z I 4242 frontend[0] core.py:88] message`
    """

    def __init__(self, role: str, fmt: str = "default"):
        super().__init__()
        self.role = role
        self.iso = fmt == "ISO8601"
        self.pid = os.getpid()

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTER.get(record.levelno, "I")
        t = time.gmtime(record.created)
        where = f"{self.pid} {self.role} {record.filename}:{record.lineno}]"
        if self.iso:
            prefix = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', t)} {letter} {where}"
        else:
            usec = int((record.created % 1) * 1_000_000)
            prefix = f"{letter}{time.strftime('%m%d %H:%M:%S', t)}.{usec:06d} {where}"
        line = f"{prefix} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class LevelSwitch(logging.Filter):
    """log_info / log_warning / log_error turn their level off; verbose records pass
    only with log_verbose_level > 0 (the root level says so too)."""

    def __init__(self, settings: LogSettings):
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s = self.settings
        n = record.levelno
        if n >= logging.ERROR:
            return s.log_error
        if n >= logging.WARNING:
            return s.log_warning
        if n >= logging.INFO:
            return s.log_info
        return s.log_verbose_level > 0


_installed: logging.Handler | None = None


def configure_logging(role: str, settings: LogSettings | None = None) -> None:
    """(Re)configure the root logger of this process from `settings`."""
    global _installed
    settings = settings or LogSettings()
    root = logging.getLogger()
    handler = _installed
    path = settings.log_file
    same_target = handler is not None and (
        (path and isinstance(handler, logging.FileHandler)
         and handler.baseFilename == os.path.abspath(path))
        or (not path and not isinstance(handler, logging.FileHandler)))
    if not same_target:
        new = (logging.FileHandler(path, mode="a", encoding="utf-8") if path
               else logging.StreamHandler(sys.stderr))
        if handler is not None:
            root.removeHandler(handler)
            handler.close()
        for h in list(root.handlers):  # a basicConfig someone made before us
            root.removeHandler(h)
        handler = _installed = new
        root.addHandler(handler)
    handler.setFormatter(TritonFormatter(role, settings.log_format))
    handler.filters = [LevelSwitch(settings)]
    root.setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)


def apply_log_settings(role: str, settings: LogSettings) -> None:
    """New settings the scheduler broadcast: apply them, and say so in this process's
    log (the line shows every process got them)."""
    configure_logging(role, settings)
    logging.getLogger("shmserve.log").info(
        "log settings applied: verbose level %d, format %s", settings.log_verbose_level,
        settings.log_format)
