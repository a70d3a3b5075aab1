"""Model control: the model-repository extension's index, load and unload, and
--model-control-mode=poll, over the model manager.

Triton's rules: in `none` and `poll` modes the load/unload API is refused; a load
polls the model's directory (or takes the files and config the call carries), loads
an ensemble's steps first, and does nothing for a model whose files are unchanged;
an unload drains the model and unloads the ensembles that use it too (and with
`unload_dependents`, an ensemble's steps). Beyond Triton, loading a model that is
serving is a reload without downtime (ModelRepositoryManager.load_version).

Loads and unloads of one model are serialised by a lock per name; different models
load in parallel, their instance starts bounded by --model-load-thread-count.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from scheduler.repository import disk, poller
from scheduler.repository.journal import Journal, read_files
from scheduler.repository.manager import ModelRepositoryManager, _Refused, _step_models
from scheduler.repository.models import ModelReadyState, ModelVersion
from shm.errors import ErrorCode, InferError
from shm.messages.repository import (IndexEntry, RepositoryOp, RepositoryReply,
                                     RepositoryRequest)
from shm.messages.results import Error

log = logging.getLogger("shmserve.scheduler")

NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
FILE_PREFIX = "file:"


def poll_failure(name: str) -> InferError:
    """Triton's answer to a load whose model cannot be read (unknown, a config that
    does not parse or validate, files without a config); the detail is logged."""
    return InferError(ErrorCode.INTERNAL,
                      f"failed to load '{name}', failed to poll from model repository")


def not_a_directory_name(name: str) -> InferError:
    """The answer to a load with files whose model name is no directory name."""
    return InferError(ErrorCode.INVALID_ARG,
                      f"load failed for model '{name}': a model name must be one "
                      "directory name (no '/', not '.' or '..')")


def directory_name(name: str) -> bool:
    """Whether `name` can be a model's directory: one path component, no NUL, not "."
    or "..", at most NAME_MAX bytes. A load names the model's directory with it (in a
    repository, or in the private folder a load's files are written to), so any other
    name would point elsewhere: '../x' or an absolute path wrote the files outside."""
    return (bool(name) and name not in (".", "..") and "/" not in name
            and "\0" not in name and len(name.encode("utf-8", "surrogatepass")) <= 255)


def _inside(path: Path, folder: Path) -> bool:
    """`path`, resolved (links followed), lies in `folder` (resolved)."""
    return path.resolve().is_relative_to(folder.resolve())


def file_path(key: str) -> str:
    """`file:<version>/<name>` -> the relative path it names; one that would leave the
    model's directory is refused."""
    rel = key[len(FILE_PREFIX):]
    norm = os.path.normpath(rel)
    if not rel or os.path.isabs(rel) or norm.startswith("..") or norm == ".":
        raise ValueError(f"invalid model file path '{rel}'")
    return norm


class ModelControl:
    def __init__(self, manager: ModelRepositoryManager, args,
                 send: Callable[[str, RepositoryReply], None] | None = None):
        self.manager = manager
        self._send = send  # answers a call (the loop's outbox)
        self._calls: set[asyncio.Task] = set()
        self.mode = args.model_control_mode
        self._locks: dict[str, asyncio.Lock] = {}
        # model name -> the private directory holding the files its load carried
        self.temp_dirs: dict[str, list[str]] = {}
        self._polled: dict[str, tuple] = {}
        # the API's calls, for a scheduler the root restarts (None: no root)
        state_dir = getattr(args, "state_dir", "")
        self.journal = Journal(state_dir)
        # files a load carries are kept beside the journal, so that a restarted
        # scheduler can load them again (the root removes them at exit)
        self.files_root = state_dir or None
        self.poller = (poller.Poller(self.poll, args.repository_poll_secs)
                       if self.mode == "poll" else None)

    def start(self) -> None:
        """After the startup load: poll mode starts watching from what it loaded."""
        if self.poller is not None:
            self._polled = self._snapshot()
            self.poller.start()

    async def stop_polling(self) -> None:
        if self.poller is not None:
            await self.poller.close()

    def remove_files(self) -> None:
        """The private model directories of loads that carried files (at stop, once
        the workers that read them are gone)."""
        for paths in self.temp_dirs.values():
            for path in paths:
                _remove(path)
        self.temp_dirs.clear()

    # -- the extension's calls ------------------------------------------------------------

    def on_call(self, call: RepositoryRequest) -> None:
        """A model-repository call, from the loop's dispatch table. A load or unload
        takes as long as its instances take to start or drain: it runs as a task, the
        loop goes on."""
        task = asyncio.get_running_loop().create_task(self._call(call))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, call: RepositoryRequest) -> None:
        reply = RepositoryReply(call.call_id)
        try:
            if self.manager.stopping:
                raise InferError(ErrorCode.UNAVAILABLE, "Server is stopping")
            match call.op:
                case RepositoryOp.INDEX:
                    reply.models = self.index(call.ready)
                case RepositoryOp.LOAD:
                    await self.load(call.model, call.config, call.files)
                case RepositoryOp.UNLOAD:
                    await self.unload(call.model, call.unload_dependents)
        except InferError as exc:
            reply.error = Error(exc.code, exc.message)
        except Exception as exc:
            log.exception("model repository call '%s' of '%s' failed", call.op, call.model)
            reply.error = Error(ErrorCode.INTERNAL, str(exc))
        self._send(call.reply_to, reply)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _allowed(self) -> None:
        if self.mode != "explicit":
            raise InferError(ErrorCode.UNAVAILABLE, NOT_ALLOWED)

    def _loaded(self, name: str) -> list[ModelVersion]:
        return [mv for mv in self.manager.models.versions(name) if mv.scheduler is not None]

    # -- index ---------------------------------------------------------------------------

    def index(self, ready: bool = False) -> list[IndexEntry]:
        """Every model in the repositories, as Triton lists them: a model never loaded
        by its name alone, others one row per version with state and reason."""
        try:
            names = sorted(self.manager.scan())
        except disk.RepositoryError as exc:
            log.error("%s", exc)
            names = sorted(self.manager.sources)
        rows = []
        for name in names:
            versions = self.manager.models.versions(name)
            if not versions and not ready:
                rows.append(IndexEntry(name))
            for mv in versions:
                if ready and mv.state is not ModelReadyState.READY:
                    continue
                rows.append(IndexEntry(name, mv.version, mv.state, mv.reason))
        return rows

    # -- load ----------------------------------------------------------------------------

    async def load(self, name: str, config: str | None = None,
                   files: dict[str, bytes] | None = None) -> None:
        self._allowed()
        await self._load(name, config, files or {})
        self.journal.loaded(name, config, self._files_dir(name) if files else None)

    def _files_dir(self, name: str) -> str | None:
        dirs = self.temp_dirs.get(name)
        return os.path.join(dirs[-1], name) if dirs else None

    async def _replay_load(self, entry) -> None:
        files = read_files(entry.files_dir) if entry.files_dir else {}
        await self._load(entry.name, entry.config, files)
        if entry.files_dir and self._files_dir(entry.name) != entry.files_dir:
            _remove(os.path.dirname(entry.files_dir))  # copied to a new one
            self.journal.loaded(entry.name, entry.config, self._files_dir(entry.name))

    async def replay(self) -> None:
        """Repeat, in order, the API calls a scheduler before this one answered (it
        was killed and the root restarted it): the same models serve again."""
        for entry in self.journal.replay_order():
            try:
                if entry.op == "unload":
                    await self._unload(entry.name, entry.unload_dependents)
                else:
                    await self._replay_load(entry)
                log.info("restored the %s of '%s' made before the restart", entry.op,
                         entry.name)
            except (InferError, OSError) as exc:
                log.error("could not repeat the %s of '%s' after the restart: %s",
                          entry.op, entry.name, getattr(exc, "message", exc))

    async def _load(self, name: str, config: str | None, files: dict[str, bytes]) -> None:
        if not directory_name(name):
            log.error("Poll failed for model directory '%s': not a directory name", name)
            if files:
                # Triton writes a load's files under a folder of its own whatever the
                # name, loads them, and answers a failed load INVALID_ARGUMENT. We
                # refuse the name before writing anything, in the same form: the
                # client's name is at fault, not the server
                raise not_a_directory_name(name)
            raise poll_failure(name)  # no such directory: Triton's answer
        async with self._lock(name):
            source, fp, temp = self._source(name, config, files)
            if fp == self.manager.fingerprints.get(name) and self._loaded(name):
                log.info("model '%s' is unchanged: not reloaded", name)
                _remove(temp)
                return
            plan = self.manager._plan(source, config)
            if isinstance(plan, _Refused):
                _remove(temp)
                log.error("Poll failed for model directory '%s': %s", name, plan.reason)
                raise poll_failure(name)
            for line in plan.warnings:
                log.warning("%s", line)
            missing = [step for step in sorted(_step_models(plan.config))
                       if not self._ready(step)]
            if not missing:
                return await self._finish(plan, fp, temp)
        # an ensemble's steps load first, outside its lock (a step's load takes its own)
        for step in missing:
            try:
                await self._load(step, None, {})
            except InferError as exc:
                log.error("loading step '%s' of ensemble '%s': %s", step, name, exc.message)
        async with self._lock(name):
            await self._finish(plan, fp, temp)

    def _ready(self, name: str) -> bool:
        return any(mv.state is ModelReadyState.READY
                   for mv in self.manager.models.versions(name))

    async def _finish(self, plan, fp: tuple, temp: str | None) -> None:
        """Apply a plan (the model's lock held) and keep what it was loaded from."""
        name = plan.name
        errors = await self._apply(plan)
        loaded_new = len(errors) < len(plan.versions)
        if not errors:
            self.manager.fingerprints[name] = fp
            for old in self.temp_dirs.pop(name, []):
                _remove(old)  # the versions that used it have drained and stopped
        else:
            self.manager.fingerprints.pop(name, None)  # the next load tries again
        if temp and loaded_new:
            self.temp_dirs.setdefault(name, []).append(temp)
        elif temp:
            _remove(temp)
        if errors:
            raise InferError(ErrorCode.INVALID_ARG, f"load failed for model '{name}': " + "".join(
                f"version {v} is at UNAVAILABLE state: {reason};\n" for v, reason in errors))

    def _source(self, name: str, config: str | None, files: dict[str, bytes]):
        """(ModelSource, fingerprint, private dir or None) for a load."""
        if files:
            if config is None:
                log.error("Poll failed for model directory '%s': Load parameter 'config' "
                          "must be specified for model file override", name)
                raise poll_failure(name)
            temp = tempfile.mkdtemp(prefix="shmserve-model-", dir=self.files_root)
            model_dir = Path(temp) / name
            digest = hashlib.sha256(config.encode())
            try:
                # the name and each file path were checked; the resolved paths are too
                if model_dir.resolve().parent != Path(temp).resolve():
                    raise ValueError(f"model directory '{name}' is not in {temp}")
                model_dir.mkdir()
                for key in sorted(files):
                    rel = file_path(key)
                    path = model_dir / rel
                    if not _inside(path, model_dir):
                        raise ValueError(f"invalid model file path '{rel}'")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(files[key])
                    digest.update(rel.encode() + b"\0" + hashlib.sha256(files[key]).digest())
            except (OSError, ValueError) as exc:
                shutil.rmtree(temp, ignore_errors=True)
                log.error("Poll failed for model directory '%s': %s", name, exc)
                raise poll_failure(name) from None
            log.info("model '%s': %d file(s) from the load request in %s", name,
                     len(files), model_dir)
            return disk.ModelSource(name, model_dir), ("files", digest.hexdigest()), temp
        try:
            source = self.manager.scan().get(name)
        except disk.RepositoryError as exc:
            log.error("%s", exc)
            raise poll_failure(name) from None
        if source is None:
            log.error("failed to poll model '%s': model not found in any model "
                      "repository.", name)
            raise poll_failure(name)
        return source, (disk.fingerprint(source.path), config), None

    async def _apply(self, plan) -> list[tuple[int, str]]:
        """Load the plan's versions (reloading those that serve), unload the versions
        its policy no longer picks. Returns the versions that failed, and why."""
        m = self.manager
        current = {mv.version: mv for mv in m.models.versions(plan.name)}
        if 0 in current and current[0].scheduler is None:
            m.models.remove(plan.name, 0)  # a failed config's placeholder
        if plan.config.platform == "ensemble":
            m.ensembles[plan.name] = _step_models(plan.config)
            load = m._load_ensemble_version
            results = [await load(plan, v, replace=_serving(current.get(v)))
                       for v in plan.versions]
        else:
            results = await asyncio.gather(*(
                m.load_version(plan, v, replace=_serving(current.get(v)))
                for v in plan.versions))
        errors = [(v, m.load_errors.get((plan.name, v), "")) for v, ok
                  in zip(plan.versions, results) if not ok]
        if len(errors) < len(plan.versions):
            for v, mv in current.items():
                if v not in plan.versions and mv.scheduler is not None:
                    await self._unload_version(mv)
        return errors

    # -- unload --------------------------------------------------------------------------

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        self._allowed()
        await self._unload(name, unload_dependents)
        self.journal.unloaded(name, unload_dependents)

    async def _unload(self, name: str, unload_dependents: bool = False) -> None:
        m = self.manager
        # the ensembles that use it go with it, as in Triton
        for ens, deps in list(m.ensembles.items()):
            if name in deps and ens != name and self._loaded(ens):
                await self._unload(ens)
        async with self._lock(name):
            loaded = self._loaded(name)
            for mv in loaded:
                mv.state = ModelReadyState.UNLOADING
                mv.reason = ""
                m.publish(mv)  # frontends refuse new requests from now on
            await asyncio.gather(*(self._unload_version(mv) for mv in loaded))
            m.fingerprints.pop(name, None)
            for temp in self.temp_dirs.pop(name, []):
                _remove(temp)
        if unload_dependents:
            steps = m.ensembles.get(name, set())
            for step in sorted(steps):
                still_used = any(step in deps and self._loaded(ens)
                                 for ens, deps in m.ensembles.items() if ens != name)
                if not still_used:
                    await self._unload(step)

    async def _unload_version(self, mv: ModelVersion) -> None:
        """Drain a version and stop its instances; it stays in the table as
        UNAVAILABLE, reason "unloaded" (what strict readiness accepts)."""
        await self.manager.retire(mv)
        mv.scheduler = None
        mv.state = ModelReadyState.UNAVAILABLE
        mv.reason = "unloaded"
        log.info("successfully unloaded '%s' version %d", mv.name, mv.version)
        self.manager.publish(mv)

    # -- poll mode -----------------------------------------------------------------------

    def _snapshot(self) -> dict[str, tuple]:
        try:
            sources = self.manager.scan()
        except disk.RepositoryError as exc:
            log.error("%s", exc)
            return dict(self._polled)  # nothing changes while the repositories are bad
        return {name: disk.fingerprint(s.path) for name, s in sources.items()}

    async def poll(self) -> None:
        """One poll: apply what changed since the last one."""
        now = self._snapshot()
        found = poller.changes(self._polled, now)
        self._polled = now
        if not found:
            return
        log.info("poll: added %s, changed %s, removed %s", found.added, found.changed,
                 found.removed)
        for name in found.removed:
            await self._unload(name)
        results = await asyncio.gather(*(self._load(name, None, {})
                                         for name in found.added + found.changed),
                                       return_exceptions=True)
        for name, result in zip(found.added + found.changed, results):
            if isinstance(result, Exception):
                log.error("poll: loading '%s' failed: %s", name, result)


def _remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _serving(mv: ModelVersion | None) -> ModelVersion | None:
    """The version a reload replaces: one that serves now."""
    if mv is not None and mv.scheduler is not None and mv.state is ModelReadyState.READY:
        return mv
    return None
