"""Python's cyclic garbage collector paused while a request maps a FHIR record.

Mapping a record makes tens of thousands of short-lived objects (the first pass's fields, the
validated R4B models, the events), each freed by its reference count when the mapping ends; on
the way they cross the collector's thresholds again and again, and its full passes walk every
object made since start-up (a hook's `ResourceCache` among them): about a third of a cold hook's
mapping in a profile (docs/benchmarks.md, "CDS Hooks latency"). The collector resumes when the
last mapping under way ends, and collects what they left in cycles at its next threshold.

    with collector_paused():
        window = FhirWindow(resources, mapping=mapping)
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_under_way = 0
_paused_here = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block (any thread; nested and concurrent blocks share one
    pause); left as it was when something else had turned it off."""
    global _under_way, _paused_here
    with _lock:
        if _under_way == 0 and gc.isenabled():
            gc.disable()
            _paused_here = True
        _under_way += 1
    try:
        yield
    finally:
        with _lock:
            _under_way -= 1
            if _under_way == 0 and _paused_here:
                _paused_here = False
                gc.enable()
