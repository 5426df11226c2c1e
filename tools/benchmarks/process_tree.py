"""Memory and CPU time of a benchmarked command's whole process tree (driver, Ray's own
processes and actors, worker processes), sampled from outside it."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class TreeUsage:
    """What a `TreeSampler` saw, in MiB and seconds."""

    peak_rss_mib: float
    """Peak RSS summed over the tree (shared pages, e.g. Ray's object store, in every process
    that maps them)."""
    peak_process_rss_mib: float
    """Peak RSS of the tree's largest process."""
    cpu_seconds: float
    """User + system CPU time, each process's last sample (a process living less than one
    interval is missed)."""
    mean_load_avg_1m: float
    """The machine's mean 1-minute load average (other processes slow the run when it exceeds
    the cores)."""


class TreeSampler:
    """Samples a process and its descendants every `every_s` seconds, in a thread, until
    `stop`."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.peak_total = 0
        self.peak_process = 0
        self.cpu: dict[int, float] = {}
        self.loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            sizes = []
            for process in processes:
                try:
                    with process.oneshot():
                        sizes.append(process.memory_info().rss)
                        times = process.cpu_times()
                    self.cpu[process.pid] = times.user + times.system
                except psutil.Error:
                    continue
            self.peak_total = max(self.peak_total, sum(sizes))
            self.peak_process = max([self.peak_process, *sizes])
            self.loads.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def stop(self) -> TreeUsage:
        """Stop sampling; what was seen."""
        self._stop.set()
        self._thread.join()
        return TreeUsage(
            peak_rss_mib=round(self.peak_total / 2**20, 1),
            peak_process_rss_mib=round(self.peak_process / 2**20, 1),
            cpu_seconds=round(sum(self.cpu.values()), 1),
            mean_load_avg_1m=round(sum(self.loads) / max(len(self.loads), 1), 2),
        )
