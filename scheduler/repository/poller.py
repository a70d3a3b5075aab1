"""--model-control-mode=poll: find what changed in the repositories and apply it.

Change detection is a pure function of two snapshots (model name -> fingerprint of its
directory, see repository.fingerprint), so it is tested without a server; the loop
takes a snapshot every --repository-poll-secs and asks the model manager to load the
added and changed models and unload the removed ones, while the server serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

log = logging.getLogger("shmserve.scheduler")


@dataclasses.dataclass(frozen=True)
class Changes:
    added: list[str]
    removed: list[str]
    changed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> Changes:
    """What a poll found: models new in `after`, gone from it, and those whose
    fingerprint (config.pbtxt, model files, version directories) differs."""
    return Changes(added=sorted(after.keys() - before.keys()),
                   removed=sorted(before.keys() - after.keys()),
                   changed=sorted(n for n in after.keys() & before.keys()
                                  if after[n] != before[n]))


class Poller:
    """Calls `poll()` (the manager's) every `interval` seconds until closed."""

    def __init__(self, poll, interval: float):
        self._poll = poll
        self.interval = interval
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._poll()
            except Exception:
                log.exception("polling the model repositories failed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
