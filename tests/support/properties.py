"""How many examples a property test draws: every one in `make test` (what CI runs), a fifth
in `make test-fast` (`FAST_PROPERTIES=1`), so the contributor's loop still runs every property
on fewer inputs and the full proof stays in the README's second command.

    @settings(max_examples=examples(1000), deadline=None)
"""

from __future__ import annotations

import os

FAST_SHARE = 5
"""`make test-fast` draws one example in this many (at least `FAST_MIN`)."""
FAST_MIN = 10


def examples(full: int) -> int:
    """`full` examples, or its fast share under `FAST_PROPERTIES=1`."""
    if os.environ.get("FAST_PROPERTIES") == "1":
        return min(full, max(FAST_MIN, full // FAST_SHARE))
    return full
