"""The response cache (Triton's `local` cache): a byte-bounded LRU of inference results.

It lives in the scheduler, which owns every model's state. Frontends compute each
request's key (frontend/cache_key.py) from the bytes they already hold; the scheduler
looks the key up before a request enters its model's queue, and a hit is answered from
here with the cached outputs inline, so the model never runs. After a miss ran, the
frontend that built the reply sends the outputs back once in a CacheInsert.

The class is pure (no clock, no I/O): the loop times lookups and insertions itself.
"""

from __future__ import annotations

import collections
import dataclasses

from shm.tensor import TensorRef

# What an entry costs beyond its tensors' bytes: the key and, per tensor, its name,
# datatype and 8 bytes per dimension, so that even empty outputs are bounded.
_DIM_BYTES = 8


def parse_cache_config(items: list[str], byte_size: int | None) -> int:
    """The local cache's size in bytes from `--cache-config local,size=N` items and the
    deprecated `--response-cache-byte-size N`; 0 means no cache.

    Triton's syntax is `<cache>,<key>=<value>`, repeatable; only the `local` cache
    exists here. The deprecated flag is converted to `local,size=N` as Triton does;
    given both, `--cache-config` wins."""
    settings: dict[str, dict[str, str]] = {}
    for item in items:
        cache, sep, setting = item.partition(",")
        key, eq, value = setting.partition("=")
        if not sep or not eq or not cache or not key:
            raise ValueError(f"--cache-config option format is "
                             f"'<cache name>,<setting>=<value>'. Got {item}")
        settings.setdefault(cache, {})[key] = value
    unknown = set(settings) - {"local"}
    if unknown:
        raise ValueError(f"unknown cache implementation '{sorted(unknown)[0]}': "
                         "only 'local' is available")
    local = settings.get("local")
    if local is None:
        return max(0, byte_size or 0)
    extra = set(local) - {"size"}
    if extra:
        raise ValueError(f"unknown setting '{sorted(extra)[0]}' for the local cache: "
                         "only 'size' is available")
    if "size" not in local:
        raise ValueError("the local cache needs a size: --cache-config local,size=BYTES")
    try:
        size = int(local["size"])
    except ValueError:
        raise ValueError(f"local cache size must be an integer number of bytes, got "
                         f"'{local['size']}'") from None
    if size < 0:
        raise ValueError(f"local cache size must not be negative, got {size}")
    return size


def entry_size(key: bytes, outputs: list[TensorRef]) -> int:
    """The bytes an entry is charged: its key, and each output's data and metadata."""
    total = len(key)
    for t in outputs:
        total += len(t.name) + len(t.datatype) + _DIM_BYTES * len(t.shape)
        total += len(t.data or b"")
    return total


@dataclasses.dataclass(slots=True)
class CacheEntry:
    """One cached result: the outputs (inline TensorRefs) of the model version named."""

    model: str
    version: int
    outputs: list[TensorRef]
    size: int


class ResponseCache:
    """Byte-bounded LRU of `key -> CacheEntry`. A lookup that hits makes the entry the
    most recently used; an insertion evicts from the least recently used end until the
    new entry fits. An entry larger than the whole cache is refused (as Triton's local
    cache refuses it) rather than emptying the cache for nothing."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.entries: collections.OrderedDict[bytes, CacheEntry] = collections.OrderedDict()
        self.lookups = self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self.entries

    def lookup(self, key: bytes) -> CacheEntry | None:
        self.lookups += 1
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry

    def insert(self, key: bytes, model: str, version: int, outputs: list[TensorRef]) -> bool:
        """Cache `outputs` (every one inline) under `key`. Returns False if the entry
        cannot be held: larger than the cache, or outputs that are not inline. A key
        already cached keeps its entry (two concurrent misses of one request both
        insert; the result is the same)."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return True
        if any(t.data is None for t in outputs):
            return False
        size = entry_size(key, outputs)
        if size > self.capacity:
            return False
        while self.used + size > self.capacity:
            _, old = self.entries.popitem(last=False)
            self.used -= old.size
            self.evictions += 1
        self.entries[key] = CacheEntry(model, version, outputs, size)
        self.used += size
        return True

    def utilization(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0
