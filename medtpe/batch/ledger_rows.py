"""`medtpe predict`'s answers in the prediction ledger: one row per scored record (door
`batch_meds` or `batch_fhir`), committed shard by shard before the shard's files are written,
so every answer in an output file has its row (fail closed: a ledger that cannot be opened stops
the job before it scores, one that cannot be written stops it before the shard is written).

A record's prediction id is derived from the run's identity (output directory, task, model,
decoding and inputs: `run_identity`) and the record's position (`run_prediction_id`), so a
resumed run gives a record the id its first run gave it and writes no row twice. A run that
stopped after a shard's rows were committed but before its files were written scores the shard
again: rows already there whose answer and p("yes") the new ones repeat are kept as they are;
an answer that differs is a `LedgerConflict` (the engine drifted between the runs)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medtpe.inference.engines.protocol import Engine
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Answer, PreparedRecord
from medtpe.inference.receipt_facts import answer_facts, run_prediction_id
from medtpe.inference.sampling import Sampling
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import Ledger, LedgerConflict, PredictionRow

CALLER = "cli"
"""The ledger's caller of `medtpe predict`'s rows."""


def run_identity(out_dir: Path, settings: Mapping[str, Any]) -> str:
    """SHA-256 of the run's output directory and settings (`medtpe.batch.job.job_settings`)."""
    data = {"out_dir": str(Path(out_dir).resolve()), **settings}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class RunLedger:
    """Where a run records its answers (picklable: Ray's generation actors open their own)."""

    settings: LedgerSettings
    run: str
    """`run_identity`."""
    door: str
    """`batch_meds` or `batch_fhir`."""

    def open(self, model: LoadedModel) -> RunRecorder | None:
        """A recorder of this run's answers by `model` (None with the ledger off;
        `LedgerUnavailable` when the ledger cannot be opened: the job stops before it scores);
        its `engine` set once started."""
        if self.settings.ledger_off:
            return None
        return RunRecorder(self, model, self.settings.signer(), self.settings.open_ledger())


@dataclass
class RunRecorder:
    """A run's ledger rows of one engine, gathered per shard and committed by `commit`."""

    run: RunLedger
    model: LoadedModel
    signer: Signer
    ledger: Ledger
    engine: Engine | None = None
    pending: list[PredictionRow] = field(default_factory=list)

    def add(
        self,
        record: int,
        prepared: PreparedRecord,
        sampling: Sampling,
        answer: Answer,
        latency_s: float,
    ) -> str:
        """The row of the job's record `record` kept for `commit`; its prediction id."""
        assert self.engine is not None, "the engine answered"
        facts = answer_facts(self.model, self.engine, prepared, sampling, answer, latency_s)
        basis = ReceiptBasis.of(facts, keep_record=self.ledger.keep_records)
        row = basis.signed(
            self.signer,
            door=self.run.door,
            caller=CALLER,
            prediction_id=run_prediction_id(self.run.run, str(record)),
        )
        self.pending.append(row)
        return row.prediction_id

    def commit(self) -> None:
        """Commit the rows gathered since the last commit (one transaction); rows a stopped
        run committed already are kept when the new ones repeat their answers."""
        rows, self.pending = self.pending, []
        try:
            self.ledger.record(rows)
        except LedgerConflict:
            self.ledger.record(_not_there(self.ledger, rows))

    def close(self) -> None:
        """Close the ledger's connections."""
        self.ledger.close()


def _not_there(ledger: Ledger, rows: Sequence[PredictionRow]) -> list[PredictionRow]:
    """The rows not in the ledger yet; a LedgerConflict for one whose id holds another answer."""
    missing = []
    for row in rows:
        there = ledger.get(row.prediction_id)
        if there is None:
            missing.append(row)
        elif (there.answer, there.p_yes) != (row.answer, row.p_yes):
            raise LedgerConflict(
                f"prediction {row.prediction_id} was recorded by an earlier run of this output "
                f"directory with answer {there.answer} (p_yes {there.p_yes}); this run answers "
                f"{row.answer} (p_yes {row.p_yes}): the engine or its inputs changed"
            )
    return missing
