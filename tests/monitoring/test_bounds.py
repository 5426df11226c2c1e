"""The report's memory bounds: a period past the rows one report reads is refused before anything
is read, naming the count and the bound; the bootstrap drawn a block at a time gives the very
weights of `subject_resample_weights`; ids are found by binary search, absent ones as -1."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from medtpe.core.metrics.scores import subject_resample_weights
from medtpe.ledger.store import Ledger
from medtpe.monitoring.figures import resample_blocks
from medtpe.monitoring.frame import PeriodTooLarge, read_monitored
from tests.support.monitoring_rows import prediction

START = datetime(2026, 11, 2, tzinfo=UTC)


def test_a_period_past_the_bound_is_refused_and_one_within_it_read(tmp_path: Path) -> None:
    ledger = Ledger.open(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    rows = [
        prediction(
            i, created_at=START + timedelta(hours=i), subject_id=str(i % 3),
            prediction_time=None, p_yes=0.1 * (i % 10),
        )
        for i in range(25)
    ]  # fmt: skip
    ledger.record(rows)
    refused = r"the period holds 25 predictions, more than one report reads \(24\)"
    with pytest.raises(PeriodTooLarge, match=refused):
        read_monitored(ledger.engine, max_rows=24)
    data = read_monitored(ledger.engine, until=START + timedelta(hours=24), max_rows=24)
    assert list(data.prediction_id) == [row.prediction_id for row in rows[:24]]
    assert data.subject_id[0] is data.subject_id[3]  # one object per repeated text
    found = data.positions([rows[5].prediction_id, "no-such-id", rows[0].prediction_id])
    assert found.tolist() == [5, -1, 0]
    ledger.close()


@pytest.mark.parametrize("block_bytes", [1, 8 * 7 * 50, 10**9])
def test_blocks_of_resamples_are_the_same_draws(block_bytes: int) -> None:
    subjects = np.array([str(i % 17) for i in range(50)], dtype=object)
    blocks = list(resample_blocks(subjects, 200, 3, block_bytes))
    expected = subject_resample_weights(subjects.astype(str), 200, 3)
    assert len(blocks) == {1: 200, 8 * 7 * 50: 29, 10**9: 1}[block_bytes]
    assert np.array_equal(np.concatenate(blocks), expected)
