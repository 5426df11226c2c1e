"""Project-owned MEDS fixtures: a small synthetic dataset written with pyarrow, and a small
byte-level BPE tokenizer trained on its rendered text (standing in for a base tokenizer)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import meds
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from medtpe.core.meds import MedsEvent
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.corpus import iter_meds_corpus_texts

T0 = datetime(2150, 3, 1, 8, 0)
PREDICTION_TIME = T0 + timedelta(hours=24)

GOOD_EVENT = {
    "subject_id": 7,
    "time": "2150-03-01T08:00:00",
    "code": "LAB//220045//bpm",
    "numeric_value": 80,
}
"""One valid MEDS event as a request body holds it."""


def validated_events(rows: list[dict]) -> list[MedsEvent]:
    """Request-body events, validated as the service validates them."""
    return [MedsEvent.model_validate(row) for row in rows]


def error_locs(exc: ValidationError) -> list[tuple]:
    """The `loc` of each error of a pydantic validation error."""
    return [e["loc"] for e in exc.errors()]


DESCRIPTIONS = {
    "LAB//220045//bpm": "Heart Rate [bpm]",
    "LAB//50912//mg/dL": "Creatinine (Blood) [mg/dL]",
    "LAB//220210//insp/min": "Respiratory Rate [insp/min]",
    "DIAGNOSIS//ICD//9//4019": "Diagnosis: Unspecified essential hypertension",
    "MEDICATION//START//Heparin": "Medication: START Heparin",
}

DATA_SCHEMA = pa.schema(
    [
        ("subject_id", pa.int64()),
        ("time", pa.timestamp("us")),
        ("code", pa.string()),
        ("numeric_value", pa.float32()),
        ("text_value", pa.large_string()),
    ]
)


def subject_rows(subject_id: int, hours: int = 30) -> list[dict]:
    """Events of one synthetic ICU subject: statics, birth, diagnosis, hourly vitals, labs."""
    rows = [
        {"subject_id": subject_id, "time": None, "code": "GENDER//F"},
        {"subject_id": subject_id, "time": datetime(2090, 1, 1), "code": "MEDS_BIRTH"},
        {
            "subject_id": subject_id,
            "time": T0 - timedelta(days=3),
            "code": "DIAGNOSIS//ICD//9//4019",
        },
        {
            "subject_id": subject_id,
            "time": T0,
            "code": "ICU_ADMISSION//Medical Intensive Care Unit (MICU)",
        },
        {"subject_id": subject_id, "time": T0, "code": "MEDICATION//START//Heparin"},
    ]
    for h in range(hours):
        time = T0 + timedelta(hours=h, minutes=30)
        rows.append(
            {
                "subject_id": subject_id,
                "time": time,
                "code": "LAB//220045//bpm",
                "numeric_value": 70.0 + h,
            }
        )
        rows.append(
            {
                "subject_id": subject_id,
                "time": time,
                "code": "LAB//220210//insp/min",
                "numeric_value": 18.0,
            }
        )
        if h % 6 == 0:
            rows.append(
                {
                    "subject_id": subject_id,
                    "time": time,
                    "code": "LAB//50912//mg/dL",
                    "numeric_value": 1.1 + h / 10,
                }
            )
            rows.append(
                {
                    "subject_id": subject_id,
                    "time": time,
                    "code": "LAB//51003//ng/mL",
                    "text_value": "<0.01",
                }
            )
    return rows


def write_table(path: Path, rows: list[dict], schema: pa.Schema = DATA_SCHEMA) -> None:
    """Write rows (missing keys become nulls) as a parquet file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    pq.write_table(pa.table(columns, schema=schema), path)


def write_meds_dataset(root: Path, subjects: tuple[int, ...] = (1, 2, 3), hours: int = 30) -> Path:
    """A MEDS dataset dir: two data shards (each subject in one, as MEDS requires; rows out of
    order), codes metadata, dataset.json, labels."""
    half = (len(subjects) + 1) // 2
    for index, shard in enumerate((subjects[:half], subjects[half:])):
        rows = [row for s in shard for row in subject_rows(s, hours)]
        if rows:  # out of order on purpose: the reader must sort
            write_table(root / "data" / "train" / f"{index}.parquet", rows[::-1])
    codes = pa.table({"code": list(DESCRIPTIONS), "description": list(DESCRIPTIONS.values())})
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    pq.write_table(codes, root / "metadata" / "codes.parquet")
    (root / "metadata" / "dataset.json").write_text(json.dumps({"dataset_name": "synthetic"}))
    labels = pa.table(
        {
            "subject_id": pa.array(list(subjects), pa.int64()),
            "prediction_time": pa.array([PREDICTION_TIME] * len(subjects), pa.timestamp("us")),
            "boolean_value": pa.array([s % 2 == 0 for s in subjects], pa.bool_()),
        }
    )
    (root / "labels").mkdir(parents=True, exist_ok=True)
    pq.write_table(labels, root / "labels" / "icu_mortality.parquet")
    return root


def write_subject_splits(root: Path, splits: dict[int, str]) -> Path:
    """`metadata/subject_splits.parquet` (`subject_id -> split`) of the MEDS dataset at `root`."""
    table = pa.table(
        {
            meds.SubjectSplitSchema.subject_id_name: pa.array(list(splits), pa.int64()),
            meds.SubjectSplitSchema.split_name: pa.array(list(splits.values()), pa.string()),
        }
    )
    pq.write_table(table, root / meds.subject_splits_filepath)
    return root


def train_tokenizer(texts: list[str], vocab_size: int = 400) -> BaseTokenizer:
    """A small byte-level BPE tokenizer (GPT-2 style pre-tokenisation, like SmolLM2's)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    raw = tokenizer.to_str()  # the fingerprint a tokenizer.json of this content would have
    return BaseTokenizer.from_json_obj(json.loads(raw), hashlib.sha256(raw.encode()).hexdigest())


def write_sharded_data(
    root: Path, shards: Sequence[Sequence[int]], hours: Callable[[int], int]
) -> Path:
    """Data shards only (no metadata): shard i holds the subjects `shards[i]` (rows out of
    order), subject s with `hours(s)` hours of events."""
    for index, subjects in enumerate(shards):
        rows = [row for s in subjects for row in subject_rows(s, hours=hours(s))]
        write_table(root / "data" / f"shard_{index}.parquet", rows[::-1])
    return root


def corpus_tokenizer_file(meds_dir: Path, out_dir: Path, vocab_size: int = 500) -> Path:
    """`out_dir`/tokenizer.json: `train_tokenizer` on the dataset's whole-history records."""
    path = out_dir / "tokenizer.json"
    texts = list(iter_meds_corpus_texts(meds_dir))
    train_tokenizer(texts, vocab_size).tokenizer.save(str(path))
    return path
