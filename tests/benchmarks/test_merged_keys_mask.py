"""`bench_fidelity diagnose --merged-keys`: the attention mask that hides each merged-away token
from every token after its merge, checked against its definition on arbitrary merges."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.bench_fidelity import merged_keys_mask
from tests.support.properties import examples


@given(st.lists(st.booleans(), min_size=1, max_size=40))
@settings(max_examples=examples(200))
def test_a_merged_away_token_is_seen_up_to_its_merges_end(ends_here: list[bool]) -> None:
    ends_here[-1] = True  # the prompt's last token ends a MedTPE token
    n = len(ends_here)
    kept = np.flatnonzero(ends_here)
    visible = merged_keys_mask(kept, n)
    for q in range(n):
        for k in range(n):
            end = next(e for e in kept if e >= k)  # where the MedTPE token holding k ends
            assert visible[q, k] == (k <= q and (ends_here[k] or q <= end))
