"""The model repository manager: loading model versions, their states, and telling
the frontends about them.

Loading a version places its instances in workers (the WorkerPool), gives it a scheduler
(scheduling.factory.create_scheduler) and registers its instances with the shared
RateLimiter. Every load of a version gets a new generation, carried in its instance
keys, so a reload can run new instances beside the old ones until it switches.

An ensemble has no instances: it loads once every model its steps name has settled
(loaded or failed), as Triton's dependency graph orders loads, is checked against
their configs, and is READY exactly while all of them are.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import time
from typing import Callable

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from scheduler.repository import config as cfg
from scheduler.repository import disk
from scheduler.scheduling import ensemble
from scheduler.metrics import option_on
from scheduler.repository.models import ModelReadyState, ModelTable, ModelVersion
from scheduler.scheduling.rate_limiter import InstanceSlot, RateLimiter, group_resources
from scheduler.scheduling.factory import create_scheduler
from scheduler.scheduling.interface import Callbacks, InstanceScheduler, Scheduler
from scheduler.processes.worker_pool import WorkerPool
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import ModelStateUpdate
from shm.messages.worker import LoadInstance

log = logging.getLogger("shmserve.scheduler")

# the reason a READY version shows in the index after a reload of it failed
RELOAD_FAILED = "reload failed, still serving the previous load: "


class ModelRepositoryManager:
    def __init__(self, args, pool: WorkerPool, rate_limiter: RateLimiter, gpus: int,
                 publish: Callable[[ModelStateUpdate], None], callbacks: Callbacks):
        self.args = args
        self.pool = pool
        self.rate_limiter = rate_limiter
        self.gpus = gpus
        self._publish = publish
        self._callbacks = callbacks  # the loop's, handed to each scheduler
        self._label_cache: dict[tuple[str, int], tuple[object, dict]] = {}
        # ensemble name -> the models its steps name; and every model's load, settled
        self.ensembles: dict[str, set[str]] = {}
        self._settled: dict[str, asyncio.Event] = {}
        self.models = ModelTable()
        self.by_instance: dict[str, InstanceScheduler] = {}  # instance key -> its scheduler
        self.load_seconds: dict[tuple[str, int], float] = {}
        self.load_errors: dict[tuple[str, int], str] = {}  # the last failed load's reason
        self._generation = itertools.count(1)
        self.stopping = False
        # the repositories' models as last scanned, and what each loaded model was
        # loaded from (repository.fingerprint and the load's override): a load of an
        # unchanged model does nothing, as in Triton
        self.sources: dict[str, disk.ModelSource] = {}
        self.fingerprints: dict[str, tuple] = {}
        self.retiring: set[Scheduler] = set()  # versions draining before they stop
        # --model-load-thread-count: versions whose instances start at once
        self._load_slots = asyncio.Semaphore(getattr(args, "model_load_thread_count", 4))
        # latency histograms per model, unless --metrics-config turns them off
        self.histograms = args.allow_metrics and option_on(args.metrics_config,
                                                           "histogram_latencies")

    # -- loading ------------------------------------------------------------------------

    async def load_repository(self) -> bool:
        try:
            sources = self.scan()
        except Exception as exc:
            log.error("%s", exc)
            return False
        plans = {name: self._plan(source) for name, source in sources.items()}
        if self.args.model_control_mode == "explicit":
            wanted = set(self.args.load_model)
            if "*" not in wanted:
                # loading an ensemble loads the models of its steps, as in Triton
                todo = list(wanted)
                while todo:
                    plan = plans.get(todo.pop())
                    if isinstance(plan, disk.ModelPlan):
                        for step in _step_models(plan.config) - wanted:
                            wanted.add(step)
                            todo.append(step)
                plans = {n: p for n, p in plans.items() if n in wanted}
        for name in plans:
            self._settled[name] = asyncio.Event()
            self.fingerprints[name] = (disk.fingerprint(sources[name].path), None)
        results = await asyncio.gather(*(self.load_model(name, plan, plans)
                                         for name, plan in plans.items()))
        return all(results)

    def scan(self) -> dict[str, disk.ModelSource]:
        """Every model in the repositories now (raises RepositoryError)."""
        self.sources = disk.scan(
            [os.path.abspath(p) for p in self.args.model_repository])
        return self.sources

    def _plan(self, source, config_override: str | None = None):
        """The model's plan, or why it cannot load (a _Refused)."""
        try:
            if (self.args.strict_model_config and config_override is None
                    and not (source.path / "config.pbtxt").is_file()):
                raise cfg.ConfigError(
                    f"model '{source.name}' has no config.pbtxt, which "
                    "--strict-model-config=true requires")
            return disk.plan_model(source, has_gpu=self.gpus > 0,
                                   gpu_ids=list(range(self.gpus)),
                                   config_override=config_override)
        except Exception as exc:
            return _Refused(source, str(exc))

    async def load_model(self, name: str, plan, plans: dict) -> bool:
        try:
            if isinstance(plan, _Refused):
                # its reason in the log too, in Triton's words (as a poll's refusal)
                log.error("Poll failed for model directory '%s': %s", name, plan.reason)
                mv = ModelVersion(name, 0, str(plan.source.path),
                                  state=ModelReadyState.UNAVAILABLE, reason=plan.reason)
                self.models.add(mv)
                self.publish(mv)
                return False
            if plan.config.platform == cfg.ENSEMBLE_PLATFORM:
                load = self._load_ensemble_version
                await self._wait_for_steps(plan, plans)
            else:
                load = self.load_version
            results = await asyncio.gather(*(load(plan, v) for v in plan.versions))
            return all(results)
        finally:
            self._settled.setdefault(name, asyncio.Event()).set()

    async def _wait_for_steps(self, plan, plans: dict) -> None:
        """Until every model the ensemble's steps name has settled. Models of a
        circular chain of ensembles are not waited for: the check then fails."""
        deps = _step_models(plan.config)
        self.ensembles[plan.name] = deps
        waits = [self._settled[d].wait() for d in deps
                 if d in self._settled and not _reaches(plans, d, plan.name)]
        await asyncio.gather(*waits)

    def _slots(self, name: str, version: int, config) -> list[InstanceSlot]:
        """One slot per instance, in Triton's order and with its names: `count`
        instances of a group, each named `<group name>_<index>`, and a KIND_GPU group
        has `count` on EACH of its GPUs (the same names on every device, as Triton
        names them). Keys are unique for this load (the device in a GPU's)."""
        generation = next(self._generation)
        slots = []
        for group in config.instance_group:
            kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
            gpu = kind == "KIND_GPU"
            for i in range(group.count):
                inst = f"{group.name}_{i}"
                for device in (group.gpus if gpu else [0]):
                    where = f"@gpu{device}" if gpu else ""
                    slots.append(InstanceSlot(
                        f"{name}/{version}/{inst}{where}#{generation}", inst, kind, device,
                        passive=group.passive, resources=group_resources(group, device),
                        priority=group.rate_limiter.priority))
        return slots

    async def load_version(self, plan, version: int,
                           replace: ModelVersion | None = None) -> bool:
        """Start a version's instances. With `replace` (the version serving now) this
        is a reload without downtime: the new instances start beside the old, requests
        keep going to the old until the new is READY, then the table switches and the
        old drains and stops. A reload that fails leaves the old serving, its reason
        noted on it (the index shows it)."""
        started = time.monotonic()
        mv = ModelVersion(plan.name, version, str(plan.path), config=plan.config)
        if replace is None:
            self.models.add(mv)
            self.publish(mv)
        slots = self._slots(plan.name, version, plan.config)
        try:
            async with self._load_slots:
                self.rate_limiter.check(slots)
                # The first instance may auto-complete the config the others then get.
                config = await self._start_instance(
                    mv, slots[0], mv.config, auto_complete=not self.args.strict_model_config)
                mv.config = config
                mv.config_json = b""  # printed again from the completed config
                await asyncio.gather(*(self._start_instance(mv, s, config)
                                       for s in slots[1:]))
        except Exception as exc:
            reason = exc.message if isinstance(exc, InferError) else str(exc)
            log.error("failed to load '%s' version %d: %s", plan.name, version, reason)
            mv.state = ModelReadyState.UNAVAILABLE
            mv.reason = reason
            for slot in slots:
                await self.pool.drop_instance(slot)
            if replace is None:
                self.publish(mv)
            else:
                replace.reason = f"{RELOAD_FAILED}{reason}"
                self.publish(replace)
            self.load_errors[(plan.name, version)] = reason
            return False
        sched = create_scheduler(plan.name, version, mv.config, self.rate_limiter,
                                 self._callbacks, histograms=self.histograms)
        sched.stats.cache_enabled = self.caches(mv.config)
        mv.scheduler = sched
        mv.slots = slots
        for slot in slots:
            self.rate_limiter.add(sched, slot)
            self.by_instance[slot.key] = sched
        mv.state = ModelReadyState.READY
        self.load_seconds[(plan.name, version)] = time.monotonic() - started
        self.load_errors.pop((plan.name, version), None)
        if replace is not None:
            self.models.add(mv)  # the switch: requests from now on go to the new
            log.info("successfully reloaded '%s' version %d", plan.name, version)
            self.publish(mv)
            await self.retire(replace)
        else:
            log.info("successfully loaded '%s' version %d", plan.name, version)
            self.publish(mv)
        return True

    async def retire(self, mv: ModelVersion) -> None:
        """Stop a version that no longer takes requests (unloaded, or replaced by a
        reload): what it has queued and running finishes, bounded by
        --exit-timeout-secs, then its instances stop."""
        sched = mv.scheduler
        if sched is None:
            return
        self.retiring.add(sched)
        sched.begin_unload()
        deadline = time.monotonic() + self.args.exit_timeout_secs
        while not sched.drained and time.monotonic() < deadline and not self.stopping:
            await asyncio.sleep(0.01)
        if not sched.drained:
            sched.fail_all(ErrorCode.UNAVAILABLE, f"model '{mv.name}' version {mv.version} "
                           "was unloaded before the request finished", self._callbacks.clock())
        self.rate_limiter.remove_owner(sched)
        for slot in mv.slots:
            if self.by_instance.get(slot.key) is sched:
                del self.by_instance[slot.key]
        await asyncio.gather(*(self.pool.drop_instance(slot) for slot in mv.slots))
        mv.slots = []
        self.retiring.discard(sched)

    async def _load_ensemble_version(self, plan, version: int,
                                     replace: ModelVersion | None = None) -> bool:
        mv = ModelVersion(plan.name, version, str(plan.path), config=plan.config)
        if replace is None:
            self.models.add(mv)
        try:
            configs = self._step_configs(plan.config)
            decoupled = ensemble.check_steps(plan.config, configs)
        except ensemble.EnsembleError as exc:
            log.error("failed to load '%s' version %d: %s", plan.name, version, exc)
            mv.state = ModelReadyState.UNAVAILABLE
            mv.reason = str(exc)
            self.load_errors[(plan.name, version)] = str(exc)
            if replace is None:
                self.publish(mv)
            else:
                replace.reason = f"{RELOAD_FAILED}{exc}"
                self.publish(replace)
            return False
        # Triton sets every ensemble's transaction policy: decoupled exactly when a
        # decoupled step is on its data flow, whatever the config said
        mv.config.model_transaction_policy.decoupled = decoupled
        mv.scheduler = ensemble.EnsembleScheduler(
            plan.name, version, plan.config, self._callbacks, histograms=self.histograms,
            decoupled_models=frozenset(name for name, c in configs.items()
                                       if c.model_transaction_policy.decoupled))
        mv.scheduler.stats.cache_enabled = self.caches(mv.config)
        mv.state = ModelReadyState.READY
        self.load_errors.pop((plan.name, version), None)
        log.info("successfully loaded '%s' version %d", plan.name, version)
        if replace is not None:
            self.models.add(mv)
            self.publish(mv)
            await self.retire(replace)
        else:
            self.publish(mv)
        return True

    def _step_configs(self, config) -> dict:
        """The config each step's model runs with, or Triton's reason it cannot run."""
        name = config.name
        steps = config.ensemble_scheduling.step
        missing = sorted({s.model_name for s in steps
                          if not any(mv.name == s.model_name for mv in self.models.all())})
        if missing:
            raise ensemble.EnsembleError(f"ensemble {name} contains models that are not "
                                         f"available or ambiguous: {', '.join(missing)}")
        configs = {}
        for step in steps:
            model, version = step.model_name, max(int(step.model_version), 0)
            if model == name:
                raise ensemble.EnsembleError(f"ensemble {name} cannot contain itself")
            mv = self.models.resolve(model, version)
            if mv is None or mv.state is not ModelReadyState.READY:
                failed = [m for m in self.models.all() if m.name == model and m.reason]
                if not self.models.resolve(model, 0):
                    why = (f" Model '{model}' loading failed with error: {failed[0].reason}"
                           if failed else "")
                    raise ensemble.EnsembleError(f"ensemble '{name}' depends on '{model}' "
                                                 f"which has no loaded version.{why}")
                raise ensemble.EnsembleError(f"ensemble '{name}' depends on '{model}' whose "
                                             f"required version {version} is not loaded.")
            configs.setdefault(model, mv.config)
        return configs

    def _refresh_ensembles(self, model: str) -> None:
        """A model's state changed: every loaded ensemble using it is READY exactly
        while all of its steps' models are."""
        for mv in list(self.models.all()):
            if mv.scheduler is None or model not in self.ensembles.get(mv.name, ()):
                continue
            if mv.state not in (ModelReadyState.READY, ModelReadyState.UNAVAILABLE):
                continue
            down = [s.model_name for s in mv.config.ensemble_scheduling.step
                    if (self.models.resolve(s.model_name, max(int(s.model_version), 0))
                        or ModelVersion("", 0, "")).state is not ModelReadyState.READY]
            state = ModelReadyState.UNAVAILABLE if down else ModelReadyState.READY
            reason = f"composing model '{down[0]}' is not ready" if down else ""
            if (state, reason) != (mv.state, mv.reason):
                mv.state, mv.reason = state, reason
                log.info("ensemble '%s' version %d is %s%s", mv.name, mv.version,
                         state.value, f": {reason}" if reason else "")
                self.publish(mv)

    async def _start_instance(self, mv: ModelVersion, slot: InstanceSlot, config,
                              auto_complete: bool = False):
        config_json = json.dumps(cfg.config_to_json(config)).encode()
        reply = await self.pool.load_instance(slot, config.backend, LoadInstance(
            slot.key, slot.name, mv.name, mv.version, mv.path, config_json,
            kind=slot.kind, device_id=slot.device_id, auto_complete=auto_complete,
            backend_config=self.args.backend_config.get(config.backend, {}),
            passive=slot.passive))
        if not reply.ok:
            raise RuntimeError(reply.error)
        if auto_complete and reply.config and reply.config != config_json:
            completed = json_format.ParseDict(json.loads(reply.config),
                                              model_config_pb2.ModelConfig(),
                                              ignore_unknown_fields=True)
            gpu_ids = list(range(self.gpus))
            completed = cfg.normalize(completed, has_gpu=self.gpus > 0, gpu_ids=gpu_ids)
            cfg.validate(completed, gpu_ids=gpu_ids if self.gpus else [])
            return completed
        return config

    # -- instances that died ------------------------------------------------------------

    def instances_lost(self, slots: list[InstanceSlot], how: str) -> None:
        now = self._callbacks.clock()
        for slot in slots:
            sched = self.by_instance.get(slot.key)
            if sched is None:
                continue  # it was never loaded
            failed = sched.instance_lost(slot, (
                f"the worker process running instance '{slot.name}' of model "
                f"'{sched.name}' {how}; the request was lost and the instance is "
                "restarting"), now)
            log.error("worker for instance '%s' of '%s' %s; %d in-flight request(s) failed",
                      slot.name, sched.name, how, failed)
            asyncio.get_running_loop().create_task(self._restart_instance(sched, slot))

    async def _restart_instance(self, sched: InstanceScheduler, slot: InstanceSlot) -> None:
        if not sched.accepting:
            return  # an unloading or replaced version: its instances stop anyway
        if not self.pool.restarts.allow(slot.key):
            log.error("instance '%s' of '%s' keeps dying; not restarting it", slot.name,
                      sched.name)
            self._mark_unavailable_if_empty(sched, "every instance failed repeatedly")
            return
        mv = self.models.resolve(sched.name, sched.version)
        try:
            await self._start_instance(mv, slot, mv.config)
        except Exception as exc:
            log.error("could not restart instance '%s' of '%s': %s", slot.name, sched.name,
                      exc)
            self._mark_unavailable_if_empty(sched, f"instance restart failed: {exc}")
            return
        if self.stopping:
            return
        sched.instance_back(slot)
        self._callbacks.wake(sched)
        log.info("instance '%s' of '%s' is back", slot.name, sched.name)

    def _mark_unavailable_if_empty(self, sched: InstanceScheduler, reason: str) -> None:
        if any(s.alive for s in self.rate_limiter.slots(sched)):
            return
        mv = self.models.resolve(sched.name, sched.version)
        if mv is None:
            return
        mv.state = ModelReadyState.UNAVAILABLE
        mv.reason = reason
        sched.fail_all(ErrorCode.UNAVAILABLE, f"model '{sched.name}' is unavailable: {reason}",
                       self._callbacks.clock())
        self.publish(mv)

    # -- what others see ----------------------------------------------------------------

    def publish(self, mv: ModelVersion) -> None:
        """Tell every frontend about a model version's state (and, through the
        ensembles that use it, theirs)."""
        self._publish(self.state_update(mv))
        if self.ensembles:
            self._refresh_ensembles(mv.name)

    def caches(self, config) -> bool:
        """Whether responses of a model with this config are cached: it enables
        response_cache and the server has a cache. Without a server cache Triton
        serves such a model uncached."""
        return (config is not None and config.response_cache.enable
                and self.args.cache_bytes > 0)

    def state_update(self, mv: ModelVersion) -> ModelStateUpdate:
        if mv.config is not None and not mv.config_json:
            mv.config_json = json.dumps(cfg.config_to_json(mv.config)).encode()
        return ModelStateUpdate(
            mv.name, mv.version, mv.state, mv.reason,
            config=mv.config.SerializeToString() if mv.config is not None else b"",
            config_json=mv.config_json, cache=self.caches(mv.config),
            labels=self._labels(mv))

    def _labels(self, mv: ModelVersion) -> dict[str, list[str]]:
        """Each output's `label_filename` read from the model directory, once per
        version (Triton reads them at load too)."""
        if mv.config is None or mv.state is not ModelReadyState.READY:
            return {}
        cached = self._label_cache.get((mv.name, mv.version))
        if cached is None or cached[0] is not mv.config:  # a reload brings a new config
            labels = {out.name: read_labels(os.path.join(mv.path, out.label_filename))
                      for out in mv.config.output if out.label_filename}
            cached = self._label_cache[(mv.name, mv.version)] = (mv.config, labels)
        return cached[1]

    def schedulers(self):
        """Every scheduler holding requests: the table's, and those of versions a
        reload or an unload is draining (a cancel, a dead frontend, the stop reach
        them too)."""
        seen = set()
        for mv in self.models.all():
            if mv.scheduler is not None:
                seen.add(mv.scheduler)
                yield mv.scheduler
        yield from [s for s in self.retiring if s not in seen]

    def instance_schedulers(self) -> list[InstanceScheduler]:
        """Every scheduler with instances, once each (a retiring version's too, until
        its instances stop)."""
        return list(dict.fromkeys(self.by_instance.values()))

    def ready_versions(self, name: str = "") -> list[ModelVersion]:
        """READY versions, of one model or all, by name then version."""
        out = [mv for mv in self.models.all() if mv.state is ModelReadyState.READY
               and mv.scheduler is not None and (not name or mv.name == name)]
        return sorted(out, key=lambda mv: (mv.name, mv.version))

    def statistics(self, name: str, version: int) -> dict:
        """The statistics extension's answer, by Triton's rules: every ready version,
        or those of one model; an unknown or unready model or version is an error."""
        versions = self.ready_versions(name)
        if name and not versions:
            raise InferError(ErrorCode.INVALID_ARG,
                             f"requested model '{name}' is not available")
        if name and version != -1:
            versions = [mv for mv in versions if mv.version == version]
            if not versions:
                raise InferError(ErrorCode.INVALID_ARG,
                                 "requested model version is not available for model "
                                 f"'{name}'")
        return {"model_stats": [mv.scheduler.stats.as_json() for mv in versions]}


@dataclasses.dataclass
class _Refused:
    """A model whose config or directory stops it loading, and why."""

    source: disk.ModelSource
    reason: str


def _step_models(config) -> set[str]:
    """The models an ensemble's steps name (none for any other model)."""
    if not config.HasField("ensemble_scheduling"):
        return set()
    return {s.model_name for s in config.ensemble_scheduling.step}


def _reaches(plans: dict, start: str, target: str) -> bool:
    """Whether ensemble `start` names `target` through its steps (a cycle)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == target:
            return True
        plan = plans.get(name)
        if name in seen or not isinstance(plan, disk.ModelPlan):
            continue
        seen.add(name)
        todo.extend(_step_models(plan.config))
    return False


def read_labels(path: str) -> list[str]:
    """A label file: one class label per line, line i naming class index i. One that
    cannot be read gives no labels (logged): classes then come as "score:index"."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("label file '%s' cannot be read: %s", path, exc)
        return []
