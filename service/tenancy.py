"""Per-caller cache salts: callers never share the engine's cached prompt prefixes.

vLLM's prefix cache would otherwise let one caller learn from response times whether another
caller's patient text is cached. Every generation carries a salt (vLLM mixes it into the hash of
the prompt's first block, so prompts with different salts share no cached block):

- with API keys configured: a keyed hash (HMAC-SHA256, secret drawn per process) of the caller's
  key, never the key itself;
- without keys: the same hash of the value of the configured header (`MEDTPE_CACHE_SALT_HEADER`,
  e.g. `X-Tenant`), requests without it sharing one salt; no header configured: one shared salt
  (None, vLLM's unsalted cache).

The salt lives only inside the process (the cache does too), so a fresh secret per process costs
nothing but the cache a restart loses anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

_SECRET = secrets.token_bytes(32)


def cache_salt(caller: str | None) -> str | None:
    """The salt of a caller identity (an API key or a tenant header's value); None: shared."""
    if caller is None:
        return None
    return hmac.new(_SECRET, caller.encode(), hashlib.sha256).hexdigest()
