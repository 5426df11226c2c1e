"""The collector pause around FHIR mapping: off inside, back on after, shared by threads."""

from __future__ import annotations

import gc
import threading

from medtpe.inference.collector import collector_paused


def test_paused_inside_and_resumed_after_even_on_error() -> None:
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            raise KeyError("the mapping failed")
    except KeyError:
        pass
    assert gc.isenabled()


def test_concurrent_blocks_share_one_pause() -> None:
    first_in, first_may_leave = threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with collector_paused():
            first_in.set()
            first_may_leave.wait(10)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the first block is still under way
    first_may_leave.set()
    thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_turned_off_elsewhere_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
