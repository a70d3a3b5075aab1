"""What the repository API changed, kept where a restarted scheduler finds it.

In explicit mode the models that serve are the command line's `--load-model` plus
every load and unload the API has answered since. A scheduler that the root process
(scheduler/processes/root.py) restarts after a crash reads only the command line, so
without a record it would come back with a different set of models than its clients
left it with. The journal is that record: one entry per model name, the last call that
succeeded (a load with its config override and the directory holding the files it
carried, or an unload), in the order they happened. It lives in the root's state
directory, which outlives every scheduler generation and is removed when the root
exits; a scheduler that runs without a root keeps no journal.

Written whole and renamed into place after every change: a crash mid-write leaves the
previous journal, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("shmserve.scheduler")

FILE_NAME = "model_control.json"


@dataclass
class Entry:
    name: str
    op: str  # "load" or "unload"
    config: str | None = None  # a load's JSON config override
    files_dir: str | None = None  # the model directory its files were written to
    unload_dependents: bool = False


class Journal:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, FILE_NAME) if state_dir else ""
        self.entries: dict[str, Entry] = {}  # insertion order is call order
        if self.path:
            self.entries = self._read()

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def loaded(self, name: str, config: str | None, files_dir: str | None) -> None:
        self._put(Entry(name, "load", config, files_dir))

    def unloaded(self, name: str, unload_dependents: bool) -> None:
        self._put(Entry(name, "unload", unload_dependents=unload_dependents))

    def replay_order(self) -> list[Entry]:
        return list(self.entries.values())

    def _put(self, entry: Entry) -> None:
        if not self.path:
            return
        self.entries.pop(entry.name, None)  # moves to the end: the latest call
        self.entries[entry.name] = entry
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump([e.__dict__ for e in self.entries.values()], f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("model control journal not written (%s): a restarted "
                        "scheduler will not repeat this call", exc)

    def _read(self) -> dict[str, Entry]:
        try:
            with open(self.path) as f:
                raw = json.load(f)
            return {e["name"]: Entry(**e) for e in raw}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("model control journal %s unreadable (%s): ignored", self.path, exc)
            return {}


def read_files(model_dir: str) -> dict[str, bytes]:
    """A model directory written by a load that carried files, back as the load's
    `file:<path>` parameters."""
    files = {}
    for root, _dirs, names in os.walk(model_dir):
        for n in names:
            path = os.path.join(root, n)
            with open(path, "rb") as f:
                files["file:" + os.path.relpath(path, model_dir)] = f.read()
    return files
