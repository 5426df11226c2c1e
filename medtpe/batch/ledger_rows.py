"""`medtpe predict`'s answers in the prediction ledger: one row per scored record (door
`batch_meds` or `batch_fhir`), committed shard by shard before the shard's files are written,
so every answer in an output file has its row (fail closed: a ledger that cannot be opened stops
the job before it scores, one that cannot be written stops it before the shard is written).

A record's prediction id is bound to its content: a UUID 5 of the run (`run_identity`: the
output directory and what decides an answer besides the record — the model, the rendering, the
decoding, the tasks asked together), the task and the record's digest (`batch_prediction_id`).
A resumed run gives an unchanged record the id its first run gave it and writes no row twice; a
record whose data changed (another patient at the same position, another event) gets a new id
and a row of its own, never an earlier record's. The same record twice in one run (a label
file's repeated row) is one prediction: one row, which both records-file rows name. A run that
stopped after a shard's rows were committed but before its files were written scores the shard
again: rows already there whose answer and p("yes") the new ones repeat are kept as they are; an
answer that differs is a `LedgerConflict` (the engine drifted between the runs)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from medtpe.inference.engines.protocol import Engine
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Answer, PreparedRecord
from medtpe.inference.receipt_facts import answer_facts
from medtpe.inference.sampling import Sampling
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.receipt import canonical_json, sha256_hex
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import Ledger, LedgerConflict, PredictionRow

CALLER = "cli"
"""The ledger's caller of `medtpe predict`'s rows."""


RUN_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:medtpe:batch-prediction-id")
"""The UUID 5 namespace of `medtpe predict`'s prediction ids."""


def run_identity(
    out_dir: Path, model: LoadedModel, sampling: Sampling, tasks: Sequence[str] = ()
) -> str:
    """SHA-256 of the run (canonical JSON): its output directory, resolved, and what decides a
    record's answer besides the record and the task — the model (`ModelIdentity`: name, mode,
    artefact id, base fingerprint), the rendering (the code descriptions' digest, the renderer's
    version, the input budget, the windowing, the prompt layout), the decoding settings
    (`Sampling.as_dict`) and, when the run asks several `tasks` about each record, their names
    (sorted): the record is rendered once within what the longest of their texts leaves
    (`Prompt.shell_tokens`), so one task's prompt of one record differs with the tasks asked
    with it, and its answer gets an id of its own in each set. The order they are asked in
    decides only which prompt the engine computes first. One task's set is the task its ids
    name already (no `tasks` key: a single-task run's ids are unchanged). Which records the run
    scores (inputs' paths, label file or times, split, partition, limit) and how fast
    (concurrency) are not part of it: a record's id follows its content."""
    predictor = model.predictor
    run = {
        "out_dir": str(Path(out_dir).resolve()),
        "model": asdict(model.identity),
        "rendering": {
            "descriptions_sha256": model.rendering.digest,
            "render_version": model.rendering.render_version,
            "max_input_tokens": predictor.max_input_tokens,
            "window_policy": predictor.windowing.policy.value,
            "window_grid_hours": predictor.windowing.grid_hours,
            "prompt_layout": predictor.layout.value,
        },
        "decoding": sampling.as_dict(),
    }
    if len(tasks) > 1:
        run["tasks"] = sorted(tasks)
    return sha256_hex(canonical_json(run))


def batch_prediction_id(run: str, task: str, record_sha256: str) -> str:
    """The prediction id of the answer to the record of digest `record_sha256` (the receipt's
    `record_sha256`) for `task` in the run `run` (`run_identity`): a UUID 5, so the same record
    in the same run has one id, and a changed record another."""
    return str(uuid.uuid5(RUN_ID_NAMESPACE, f"{run}/{task}/{record_sha256}"))


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
    pending: dict[str, PredictionRow] = field(default_factory=dict)
    """The rows kept for `commit`, by prediction id."""

    def add(
        self,
        prepared: PreparedRecord,
        sampling: Sampling,
        answer: Answer,
        latency_s: float,
    ) -> str:
        """The row of the answer to `prepared` kept for `commit`; its prediction id
        (`batch_prediction_id`). The same record answered again in this run keeps its first row
        when the answer repeats it, else a `LedgerConflict`."""
        assert self.engine is not None, "the engine answered"
        facts = answer_facts(self.model, self.engine, prepared, sampling, answer, latency_s)
        basis = ReceiptBasis.of(facts, keep_record=self.ledger.keep_records)
        row = basis.signed(
            self.signer,
            door=self.run.door,
            caller=CALLER,
            prediction_id=batch_prediction_id(self.run.run, basis.task, basis.record_sha256),
        )
        earlier = self.pending.setdefault(row.prediction_id, row)
        if earlier is not row:
            _check_repeats(earlier, row, "earlier in this run")
        return row.prediction_id

    def commit(self) -> None:
        """Commit the rows gathered since the last commit (one transaction); rows a stopped
        run committed already are kept when the new ones repeat their answers."""
        rows, self.pending = list(self.pending.values()), {}
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
        else:
            _check_repeats(there, row, "by an earlier run of this output directory")
    return missing


def _check_repeats(there: PredictionRow, row: PredictionRow, where: str) -> None:
    """A LedgerConflict when `row` answers otherwise than `there`, recorded under its id
    `where`."""
    if (there.answer, there.p_yes) != (row.answer, row.p_yes):
        raise LedgerConflict(
            f"prediction {row.prediction_id} was recorded {where} with answer {there.answer} "
            f"(p_yes {there.p_yes}); this run answers {row.answer} (p_yes {row.p_yes}) to the "
            "same record: the engine or its inputs changed"
        )
