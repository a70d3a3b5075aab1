"""Which scheduler a model version gets, from its config, as Triton core chooses in
`TritonModel::SetConfiguredScheduler` (backend_model.cc): the sequence batch scheduler
with `sequence_batching`, else the dynamic batch scheduler, which is also the default.
Ensembles get theirs from the model manager, which knows their steps.

Its own module so that the interface (scheduling/interface.py) imports no scheduler:
the schedulers import the interface, and only this module imports them.
"""

from __future__ import annotations

from scheduler.scheduling.dynamic_scheduler import DynamicBatchScheduler
from scheduler.scheduling.interface import Callbacks, InstanceScheduler
from scheduler.scheduling.rate_limiter import RateLimiter
from scheduler.scheduling.sequence_scheduler import SequenceBatchScheduler


def create_scheduler(name: str, version: int, config, rate_limiter: RateLimiter,
                     callbacks: Callbacks, *, histograms: bool = True,
                     environ: dict | None = None) -> InstanceScheduler:
    """The scheduler Triton would give this model config."""
    kind = (SequenceBatchScheduler if config.HasField("sequence_batching")
            else DynamicBatchScheduler)
    return kind(name, version, config, rate_limiter, callbacks, histograms=histograms,
                environ=environ)
