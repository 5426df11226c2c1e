"""`ResourceCache`: what each resource given as JSON text gave, kept under the digest of that
text and bounded in bytes, so a record sent again reads only its new resources."""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from medtpe.core.fhir.parsing import resource_items
from medtpe.core.fhir.resource_read import ResourceRead
from medtpe.core.fhir.site_mapping import SiteMapping


class ResourceCache:
    """What each resource given as JSON text gave under one site mapping, kept under the BLAKE2b
    digest of that exact text (128 bits: an equal digest is the same resource), for
    `meds_from_fhir`. Bounded in bytes: the least recently used go first while the estimated
    bytes kept (`nbytes`: each entry's events, texts and kept R4B model, `read_bytes`) exceed
    `max_bytes` (0: keep nothing); an entry larger than the bound is not kept. Safe to share
    between threads.

    Memory: about 1 KB per Observation, 3 to 4 KB per kept Patient or Encounter model (MIMIC-IV
    demo ICU stays); the texts themselves are not kept."""

    def __init__(self, mapping: SiteMapping, max_bytes: int) -> None:
        self.mapping = mapping
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._reads: OrderedDict[bytes, tuple[ResourceRead, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._reads)

    def get_many(self, texts: Sequence[bytes | None]) -> list[ResourceRead | None]:
        """What each text gave (None: not kept, or no text)."""
        keys = [_digest(text) if text is not None else None for text in texts]
        with self._lock:
            found = [self._reads.get(key) if key is not None else None for key in keys]
            for key, kept in zip(keys, found, strict=True):
                if key is not None and kept is not None:
                    self._reads.move_to_end(key)
        return [kept[0] if kept is not None else None for kept in found]

    def put_many(self, reads: Sequence[tuple[bytes, ResourceRead]]) -> None:
        """Keep these, dropping the least recently used beyond the byte bound."""
        if self.max_bytes <= 0:
            return
        sized = [(_digest(text), read, read_bytes(read)) for text, read in reads]
        with self._lock:
            for key, read, size in sized:
                if size > self.max_bytes:
                    continue
                old = self._reads.pop(key, None)
                if old is not None:
                    self.nbytes -= old[1]
                self._reads[key] = (read, size)
                self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, size) = self._reads.popitem(last=False)
                self.nbytes -= size


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=16).digest()


_ENTRY_BYTES = 600
"""A cache entry's fixed cost: its key, its slot in the index, the `ResourceRead` and its tuples."""


_EVENT_BYTES = 200
"""An event's fixed cost: its tuple, time and number (its texts are counted apart)."""


def read_bytes(read: ResourceRead) -> int:
    """The estimated bytes a `ResourceCache` entry of `read` keeps alive."""
    size = _ENTRY_BYTES + len(read.events or ()) * _EVENT_BYTES
    for event in read.events or ():
        size += sys.getsizeof(event.code) + (sys.getsizeof(event.text) if event.text else 0)
    for code, description in read.described:
        size += sys.getsizeof(code) + sys.getsizeof(description)
    for name, reference in read.references:
        size += sys.getsizeof(name) + sys.getsizeof(reference)
    return size + (_object_bytes(read.resource) if read.resource is not None else 0)


def _object_bytes(value: object) -> int:
    """`sys.getsizeof` of a validated model and everything it holds (models, lists, texts)."""
    size = sys.getsizeof(value)
    if isinstance(value, list | tuple):
        return size + sum(_object_bytes(item) for item in value)
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict):
        size += sys.getsizeof(fields)
        size += sum(_object_bytes(item) for item in fields.values() if item is not None)
    return size


def cached_items(
    resources: Mapping[str, Any] | Sequence[Mapping[str, Any] | bytes],
    mapping: SiteMapping,
    cache: ResourceCache | None,
) -> tuple[list[Any], bool, list[bytes | None], list[ResourceRead | None]]:
    """The resources' items (`resource_items`), whether they came in a Bundle, their JSON texts
    (None: given as a dict) and what `cache` (of `mapping`) holds of each."""
    if cache is not None and cache.mapping is not mapping:
        raise ValueError("the resource cache holds another site mapping's readings")
    items, in_bundle = resource_items(resources)
    texts = [data if isinstance(data, bytes) else None for _, _, data in items]
    known = cache.get_many(texts) if cache is not None else [None] * len(items)
    return items, in_bundle, texts, known
