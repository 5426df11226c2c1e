"""Per-caller cache salts: callers never share the engine's cached prompt prefixes.

vLLM's prefix cache would otherwise let one caller learn from response times whether another
caller's patient text is cached. Every generation carries a salt (vLLM mixes it into the hash of
the prompt's first block, so prompts with different salts share no cached block):

- with API keys configured: a keyed hash (HMAC-SHA256, a secret drawn per engine) of the
  caller's key, never the key itself;
- without keys: the same hash of the value of the configured header (`MEDTPE_CACHE_SALT_HEADER`,
  e.g. `X-Tenant`), requests without it sharing one salt; no header configured: one shared salt
  (None, vLLM's unsalted cache).

The secret lives as long as the engine's cache: drawn when the instance starts, shared by every
API process in front of the one engine (`MEDTPE_API_WORKERS`, medtpe/service/api_processes.py), so a
caller's re-scores hit its cached prefix whichever process serves them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32


def new_secret() -> bytes:
    """A fresh salt secret (one per engine)."""
    return secrets.token_bytes(SECRET_BYTES)


class CacheSalts:
    """Cache salts keyed by one secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else new_secret()

    def of(self, caller: str | None) -> str | None:
        """The salt of a caller identity (an API key or a tenant header's value); None: shared.

        >>> salts = CacheSalts(bytes(32))
        >>> salts.of("key-1") == CacheSalts(bytes(32)).of("key-1") != salts.of("key-2")
        True
        """
        if caller is None:
            return None
        return hmac.new(self._secret, caller.encode(), hashlib.sha256).hexdigest()
