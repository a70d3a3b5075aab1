"""The model-repository extension: frontend -> scheduler and back."""

from __future__ import annotations

import enum

import msgspec

from shm.messages.results import Error


class RepositoryOp(enum.StrEnum):
    """A model-repository call's operation (its value travels; an unknown one does not
    decode)."""

    INDEX = "index"
    LOAD = "load"
    UNLOAD = "unload"


class ModelReadyState(enum.StrEnum):
    """A model version's state, as Triton names it (its value travels: the bytes on
    the wire are the name's; an unknown one does not decode)."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class RepositoryRequest(msgspec.Struct, tag=True, array_like=True, omit_defaults=True,
                        frozen=True):
    """One call of the model-repository extension. For a load, `config` is a JSON
    ModelConfig overriding config.pbtxt (None: none given) and `files` maps
    "file:<version>/<name>" to the file's bytes."""

    call_id: int
    reply_to: str
    op: RepositoryOp
    model: str = ""
    ready: bool = False  # index: only READY versions
    config: str | None = None
    files: dict[str, bytes] = {}
    unload_dependents: bool = False


class IndexEntry(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """One row of the repository index. A model never loaded has only its name, as
    Triton lists it; `version` 0 is a model whose config failed before its versions
    were known."""

    name: str
    version: int = 0
    state: ModelReadyState | None = None  # None: never loaded
    reason: str = ""


class RepositoryReply(msgspec.Struct, tag=True, array_like=True, omit_defaults=True):
    call_id: int
    error: Error | None = None
    models: list[IndexEntry] = []
