"""Model repositories on disk: which models exist, which versions to load, and the plan.

Follows Triton's model repository manager: every subdirectory of a repository is a
model, a model name must be unique across repositories, version directories are
integers (no leading zeros), and the version policy picks among them. Reads directories
only; loading is someone else's job.
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from scheduler.repository.config import ConfigError, load_config, normalize, validate

# Subdirectories of a model that Triton never treats as versions.
_NOT_VERSIONS = {"warmup", "initial_state", "configs"}
# Triton ignores version directories with leading zeros ("01"), but "0" is a version.
_VERSION_DIR = re.compile(r"0|[1-9][0-9]*")


class RepositoryError(Exception):
    """A repository or model directory that cannot be served, with the reason."""


@dataclass
class ModelSource:
    """A model directory found in a repository."""

    name: str
    path: Path


@dataclass
class ModelPlan:
    """What to load for one model: its normalized, validated config and versions."""

    name: str
    path: Path
    config: ModelConfig
    versions: list[int]
    # Things Triton only logs, e.g. a specific version whose directory is missing.
    warnings: list[str] = field(default_factory=list)


def scan(repositories: list[Path]) -> dict[str, ModelSource]:
    """Every model in `repositories`, by name; hidden entries and plain files are skipped.

    A model name found in two repositories is an error, as is a missing repository
    (Triton refuses both at startup).
    """
    found: dict[str, ModelSource] = {}
    for repository in repositories:
        repository = Path(repository)
        if not repository.is_dir():
            raise RepositoryError(f"model repository '{repository}' does not exist "
                                  "or is not a directory")
        for entry in sorted(repository.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            if entry.name in found:
                raise RepositoryError(
                    f"failed to poll model '{entry.name}': not unique across all model "
                    f"repositories ({found[entry.name].path} and {entry})")
            found[entry.name] = ModelSource(entry.name, entry)
    return dict(sorted(found.items()))


def available_versions(model_dir: Path) -> list[int]:
    """The version directories of a model, ascending; other entries are ignored."""
    model_dir = Path(model_dir)
    versions = []
    for entry in model_dir.iterdir():
        if entry.name in _NOT_VERSIONS or not _VERSION_DIR.fullmatch(entry.name):
            continue
        if entry.is_dir():
            versions.append(int(entry.name))
    return sorted(versions)


def select_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """The versions `config.version_policy` picks from `available`, ascending.

    `latest` takes the highest `num_versions`, `all` takes every one, `specific` takes the
    listed ones that exist (Triton only logs the missing ones; see `missing_versions`).
    Picking none is an error, with Triton's message.
    """
    policy = config.version_policy
    present = sorted(set(available))
    if policy.HasField("specific"):
        chosen = sorted(set(policy.specific.versions) & set(present))
    elif policy.HasField("all"):
        chosen = present
    else:
        # `latest` (normalize makes it explicit); num_versions 0 picks nothing.
        count = policy.latest.num_versions if policy.HasField("latest") else 1
        chosen = present[len(present) - count:] if count > 0 else []
    if not chosen:
        raise RepositoryError("at least one version must be available under the version "
                              f"policy of model '{config.name}'")
    return chosen


def missing_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """Versions a `specific` policy names whose directories do not exist."""
    policy = config.version_policy
    if not policy.HasField("specific"):
        return []
    return sorted(set(policy.specific.versions) - set(available))


def plan_model(source: ModelSource, *, has_gpu: bool = False,
               gpu_ids: list[int] | None = None,
               config_override: str | None = None) -> ModelPlan:
    """Read, normalize and validate a model's config and choose its versions.

    `config_override` is the load API's JSON ModelConfig, used instead of the
    directory's config.pbtxt. Raises ConfigError for the config and RepositoryError for
    the directory, each with the reason a Triton user would see.
    """
    path = Path(source.path)
    if not path.is_dir():
        raise RepositoryError(f"model directory '{path}' does not exist")
    if config_override is not None:
        config = parse_override(config_override, source.name)
    else:
        config = load_config(path)
    available = available_versions(path)
    config = normalize(config, has_gpu=has_gpu, gpu_ids=gpu_ids,
                       model_files=_first_version_files(path, available))
    validate(config, gpu_ids=_usable_gpus(has_gpu, gpu_ids))
    versions = select_versions(config, available)
    warnings = [f"version {v} is specified for model '{config.name}', but the version "
                "directory is not present" for v in missing_versions(config, available)]
    return ModelPlan(source.name, path, config, versions, warnings)


def parse_override(text: str, name: str) -> ModelConfig:
    """The load API's `config` parameter: a ModelConfig in JSON. Its name defaults to
    the model's and must equal it, as a config.pbtxt's must."""
    try:
        config = json_format.Parse(text, ModelConfig())
    except (json_format.ParseError, ValueError, RecursionError) as e:
        # RecursionError: JSON nested past json's stack (~1000 levels)
        raise ConfigError(f"Invalid config override: {e}") from None
    if not config.name:
        config.name = name
    elif config.name != name:
        raise ConfigError(f"unexpected directory name '{name}' for model "
                          f"'{config.name}', directory name must equal model name")
    return config


def fingerprint(model_dir: Path) -> tuple:
    """What a change to a model directory changes: every file's relative path, size and
    modification time (Triton compares the files' mtimes), hidden entries skipped. A
    directory that cannot be read gives ()."""
    rows = []
    root = str(model_dir)
    try:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = os.path.relpath(dirpath, root)
            rows.append((rel, "", 0, 0))  # an empty version directory counts too
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except OSError:
                    continue  # removed while we walked: the next poll sees it
                rows.append((rel, name, st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(rows)


def _first_version_files(model_dir: Path, available: list[int]) -> list[str]:
    """Names in the version directory Triton inspects to guess a backend.

    Triton takes the first subdirectory in string order; we take the first *version*
    directory in that order, so a stray ".ipynb_checkpoints" cannot hide the model file.
    """
    if not available:
        return []
    first = min(str(v) for v in available)
    try:
        return [entry.name for entry in (model_dir / first).iterdir()]
    except OSError as e:
        raise RepositoryError(f"failed to read version directory {model_dir / first}: "
                              f"{e}") from None


def _usable_gpus(has_gpu: bool, gpu_ids: list[int] | None) -> list[int]:
    if not has_gpu:
        return []
    return list(gpu_ids) if gpu_ids is not None else [0]


__all__ = ["ConfigError", "ModelPlan", "ModelSource", "RepositoryError", "available_versions",
           "fingerprint", "missing_versions", "parse_override", "plan_model", "scan",
           "select_versions"]
