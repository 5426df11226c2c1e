"""A Ray session for `--ray [ADDRESS]`: a new local cluster for "local", else the cluster at
ADDRESS ("auto" inside a Ray cluster or a KubeRay job, "ray://host:10001" from outside). Ray is
the optional `medtpe[ray]` extra and is imported only here and in the Ray backends."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

LOCAL = "local"  # `--ray` without an address: start a local cluster on this machine


class RayUnavailableError(RuntimeError):
    """Ray is not installed, or the cluster at the given address cannot be reached."""


def check_ray_installed(setting: str) -> None:
    """Fail at start-up, naming `setting`, when the `ray` extra is missing."""
    if importlib.util.find_spec("ray") is None:
        raise RayUnavailableError(f"{setting} needs Ray: pip install 'medtpe[ray]'")


@contextmanager
def ray_session(address: str) -> Iterator[None]:
    """Connected to Ray for the block: reuses a session this process already has, else starts
    a local cluster (`address` "local") or connects to `address`, and shuts down after."""
    check_ray_installed("--ray")
    import ray

    if ray.is_initialized():
        yield
        return
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, ValueError) as exc:
        raise RayUnavailableError(f"--ray {address}: cannot connect to Ray ({exc})") from exc
    try:
        yield
    finally:
        ray.shutdown()
