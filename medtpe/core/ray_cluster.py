"""A Ray session for `--ray [ADDRESS]`: a new local cluster for "local", else the cluster at
ADDRESS ("auto" inside a Ray cluster or a KubeRay job, "ray://host:10001" from outside). Ray is
the optional `medtpe[ray]` extra and is imported only here and in the Ray backends."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from contextlib import contextmanager

LOCAL = "local"  # `--ray` without an address: start a local cluster on this machine
_CONNECT_TIMEOUT_S = 10  # Ray itself retries an unreachable address for minutes


class RayUnavailableError(RuntimeError):
    """Ray is not installed, or the cluster at the given address cannot be reached."""


def check_ray_installed(setting: str) -> None:
    """Fail at start-up, naming `setting`, when the `ray` extra is missing."""
    if importlib.util.find_spec("ray") is None:
        raise RayUnavailableError(f"{setting} needs Ray: pip install 'medtpe[ray]'")


def _check_reachable(address: str) -> None:
    """Fail fast, naming `address`, when nothing listens at a HOST:PORT or ray://HOST:PORT."""
    if address in (LOCAL, "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), _CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise RayUnavailableError(f"--ray {address}: cannot connect to Ray ({exc})") from exc


@contextmanager
def ray_session(address: str, num_cpus: int | None = None) -> Iterator[None]:
    """Connected to Ray for the block: reuses a session this process already has, else starts
    a local cluster (`address` "local", with `num_cpus` CPUs, None: the machine's) or connects
    to `address`, and shuts down after."""
    check_ray_installed("--ray")
    import ray

    if ray.is_initialized():
        yield
        return
    _check_reachable(address)
    try:
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, ValueError) as exc:
        raise RayUnavailableError(f"--ray {address}: cannot connect to Ray ({exc})") from exc
    try:
        yield
    finally:
        ray.shutdown()
