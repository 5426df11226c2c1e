"""The `--ray [ADDRESS]` option of the commands that can run on a Ray cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from medtpe.core.ray_cluster import LOCAL

F = TypeVar("F", bound=Callable[..., Any])


def ray_option(what: str) -> Callable[[F], F]:
    """`--ray [ADDRESS]` (parameter `ray_address`): run `what` on Ray, on a new local cluster
    without ADDRESS, else on the cluster at ADDRESS (needs the `medtpe[ray]` extra)."""
    return click.option(
        "--ray",
        "ray_address",
        is_flag=False,
        flag_value=LOCAL,
        default=None,
        metavar="[ADDRESS]",
        help=f"Run {what} on Ray Data: a new local Ray cluster without ADDRESS, else the "
        "cluster at ADDRESS ('auto' inside a Ray cluster or KubeRay job, ray://HOST:10001 from "
        "outside). Needs pip install 'medtpe[ray]'.",
    )
