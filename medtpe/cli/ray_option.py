"""The `--ray [ADDRESS]` option of the commands that can run on a Ray cluster."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from medtpe.core.ray_cluster import LOCAL

F = TypeVar("F", bound=Callable[..., Any])
AUTO = "auto"
"""`--ray auto`: the cluster this process runs in (a Ray node, a KubeRay job)."""
_HOST_PORT = re.compile(r"(ray://)?[^\s/:]+:[0-9]{1,5}")
"""`HOST:PORT` or `ray://HOST:PORT`."""


class RayAddress(click.ParamType):
    """A Ray cluster's address: `local`, `auto`, `HOST:PORT` or `ray://HOST:PORT`; another value
    is a usage error saying what is expected."""

    name = "address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """`value` when it is such an address."""
        text = str(value)
        if text not in (LOCAL, AUTO) and not _HOST_PORT.fullmatch(text):
            self.fail(
                f"{text!r} is not a Ray address: expected {AUTO}, HOST:PORT or ray://HOST:PORT "
                "(no ADDRESS: a new local cluster)",
                param,
                ctx,
            )
        return text


def ray_option(what: str) -> Callable[[F], F]:
    """`--ray [ADDRESS]` (parameter `ray_address`): run `what` on Ray, on a new local cluster
    without ADDRESS, else on the cluster at ADDRESS (needs the `medtpe[ray]` extra)."""
    return click.option(
        "--ray",
        "ray_address",
        type=RayAddress(),
        is_flag=False,
        flag_value=LOCAL,
        default=None,
        metavar="[ADDRESS]",
        help=f"Run {what} on Ray Data: a new local Ray cluster without ADDRESS, else the "
        "cluster at ADDRESS ('auto' inside a Ray cluster or KubeRay job, ray://HOST:10001 from "
        "outside). Needs pip install 'medtpe[ray]'.",
    )
