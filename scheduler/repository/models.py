"""The model repository manager's bookkeeping: every model version and its state."""

from __future__ import annotations

import dataclasses

from scheduler.scheduling.rate_limiter import InstanceSlot
from shm.messages.repository import ModelReadyState

__all__ = ["ModelReadyState", "ModelTable", "ModelVersion"]


@dataclasses.dataclass
class ModelVersion:
    """One version of one model: its state, final config, queue and instances."""

    name: str
    version: int  # 0 for a model that failed before its versions were known
    path: str
    state: ModelReadyState = ModelReadyState.LOADING
    reason: str = ""
    config: object = None  # ModelConfig
    config_json: bytes = b""
    scheduler: object = None  # its Scheduler (scheduling.interface) once READY
    slots: list[InstanceSlot] = dataclasses.field(default_factory=list)


class ModelTable:
    """Model name -> version -> ModelVersion, with the lookups requests need."""

    def __init__(self):
        self._models: dict[str, dict[int, ModelVersion]] = {}

    def add(self, mv: ModelVersion) -> None:
        self._models.setdefault(mv.name, {})[mv.version] = mv

    def resolve(self, name: str, version: int) -> ModelVersion | None:
        """The version a request names; 0 means the highest ready version."""
        versions = self._models.get(name)
        if not versions:
            return None
        if version:
            return versions.get(version)
        ready = [v for v, mv in versions.items() if mv.state is ModelReadyState.READY]
        return versions[max(ready)] if ready else None

    def versions(self, name: str) -> list[ModelVersion]:
        """Every version of `name` the table holds, ascending."""
        return [mv for _, mv in sorted(self._models.get(name, {}).items())]

    def remove(self, name: str, version: int) -> None:
        versions = self._models.get(name, {})
        versions.pop(version, None)
        if not versions:
            self._models.pop(name, None)

    def all(self):
        for versions in self._models.values():
            yield from versions.values()

    def state_table(self) -> str:
        """Triton's startup table of models, versions and states."""
        rows = [("Model", "Version", "Status")]
        for mv in sorted(self.all(), key=lambda m: (m.name, m.version)):
            status = mv.state.value if mv.state is not ModelReadyState.UNAVAILABLE else \
                f"UNAVAILABLE: {mv.reason}"
            # a model error's reason spans lines (its "At:" frames): one row each, as
            # Triton prints it
            first, *more = status.rstrip("\n").split("\n") or [""]
            rows.append((mv.name, str(mv.version) if mv.version else "-", first))
            rows.extend(("", "", extra) for extra in more)
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        out = [line]
        for i, row in enumerate(rows):
            out.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
            if i == 0:
                out.append(line)
        out.append(line)
        return "\n".join(out)
