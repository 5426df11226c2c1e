"""Secrets kept out of log lines and messages: `mask_secrets` hides whatever form a secret takes
in a text (a URL's user information, a password or token query or key=value parameter, a bearer
token, any value registered as secret), and `install_log_masking` applies it to every log record
of the process, its exception text included.

>>> mask_secrets("redis://:pw@store:6379/0 and redis://store?password=pw")
'redis://***@store:6379/0 and redis://store?password=***'
>>> mask_secrets("postgresql://medtpe:s3cret@db/ledger")
'postgresql://***@db/ledger'
>>> mask_secrets("host=db password=s3cret dbname=ledger")
'host=db password=*** dbname=ledger'
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

MASK = "***"
MIN_SECRET_CHARS = 4
"""Registered secrets shorter than this are not searched for in text (they would mask
ordinary words); they are still masked in the forms below."""

_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@\"']*@")
"""A URL's user information (`user:password@`, `:password@`, `token@`), up to its last `@`."""
_SECRET_NAMES = (
    r"password|passwd|pwd|pass|secret|client_secret|token|access_token|refresh_token|"
    r"id_token|api[_-]?key|apikey|auth|authorization|credentials?|sig|signature"
)
_PARAMETER = re.compile(
    rf"(?P<name>\b(?:{_SECRET_NAMES}))(?P<sep>[\"']?\s*[=:]\s*)(?P<quote>[\"']?)(?!(?:Bearer|Basic)\s)[^\s&;,\"']+",
    re.IGNORECASE,
)
"""`password=...`, `token: ...`, `"api_key": "..."` (query strings, key=value DSNs, JSON)."""
_BEARER = re.compile(r"(?P<scheme>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)

_registered: set[str] = set()
_lock = threading.Lock()
_installed = False


def register_secrets(values: Iterable[str]) -> None:
    """Remember `values` as secrets: `mask_secrets` hides them wherever they appear."""
    with _lock:
        _registered.update(v for v in values if len(v) >= MIN_SECRET_CHARS)


def url_secrets(url: str) -> list[str]:
    """The password of a URL and its secret query parameters' values (as written and decoded),
    to register: a library's message may quote them without the URL around them."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password, unquote(password)] if password else []
    for pair in parts.query.split("&"):
        name, _, value = pair.partition("=")
        if value and re.fullmatch(_SECRET_NAMES, name, re.IGNORECASE):
            found += [value, unquote(value)]
    return found


def mask_secrets(text: str) -> str:
    """`text` with every secret replaced by `***` (module docstring)."""
    text = _USERINFO.sub(rf"\g<scheme>{MASK}@", text)
    text = _BEARER.sub(rf"\g<scheme>{MASK}", text)
    text = _PARAMETER.sub(rf"\g<name>\g<sep>\g<quote>{MASK}", text)
    with _lock:
        known = sorted(_registered, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    return text


RecordFactory = Callable[..., logging.LogRecord]


def _masked_argument(value: Any) -> Any:
    """A log argument with its secrets masked: a text masked; anything else kept as it is unless
    its text holds a secret, then replaced by its masked text."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, int | float | bool) or value is None:
        return value
    text = str(value)
    masked = mask_secrets(text)
    return value if masked == text else masked


def _masked_record_factory(factory: RecordFactory) -> RecordFactory:
    """A record factory whose records carry their message, arguments and exception text masked.
    The arguments keep their shape (a tuple stays a tuple of as many, a mapping a mapping):
    formatters such as uvicorn's access-log one read them one by one."""

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if isinstance(record.msg, str):
            record.msg = mask_secrets(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_masked_argument(a) for a in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {k: _masked_argument(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
        return record

    return make


def install_log_masking(secrets: Iterable[str] = ()) -> None:
    """Mask secrets in every log record this process makes from now on (once per process;
    later calls only register more `secrets`)."""
    global _installed
    register_secrets(secrets)
    with _lock:
        if _installed:
            return
        _installed = True
        logging.setLogRecordFactory(_masked_record_factory(logging.getLogRecordFactory()))
