"""Benchmark text for the tokenizer benchmarks: MIMIC-IV demo ICU records split by patient,
plus text the vocabulary was not mined for (plain English, the task instructions)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.core.meds import MedsDataset, read_labels
from medtpe.core.paths import project_root
from medtpe.core.prompt import render_record
from medtpe.core.tasks import get_task, list_tasks
from medtpe.core.tokenizer import BaseTokenizer

SHARED = project_root().parent / "shared"
MEDS_DIR = SHARED / "data" / "mimic-iv-demo-meds"
QWEN = SHARED / "tokenizers" / "qwen2.5" / "tokenizer.json"
MAX_PROMPT_TOKENS = 8192  # original-token budget of a prompt (DESIGN.md)
SUBJECT_OFFSET = 10**8  # synthetic shard k's subjects are the demo's ids + k * SUBJECT_OFFSET


def icu_split(base: BaseTokenizer, held_out_every: int = 4) -> tuple[list[str], list[str]]:
    """(mining texts, held-out prompt records). Every `held_out_every`-th patient (sorted ids) is
    held out; mining uses the other patients' ICU prompt records and whole histories;
    held-out records are ICU-mortality prompts (24 h after admission, newest 8,192 tokens)."""
    dataset = MedsDataset.load(MEDS_DIR)
    held_out = set(sorted(dataset.subject_ids)[::held_out_every])
    train, test = [], []
    for row in read_labels(MEDS_DIR / "labels"):
        events = dataset.events(row.subject_id)
        text = render_record(
            events, dataset.descriptions, row.prediction_time, base, MAX_PROMPT_TOKENS
        ).text
        (test if row.subject_id in held_out else train).append(text)
    for subject in sorted(set(dataset.subject_ids) - held_out):
        train.append(render_record(dataset.events(subject), dataset.descriptions).text)
    return train, test


def unmined_texts() -> dict[str, str]:
    """Text the vocabulary was not mined for: an English licence text and the task prompts."""
    tasks = []
    for name in list_tasks():
        task = get_task(name)
        tasks.append((task.system_prompt or "") + "\n" + task.user_message(""))
    return {
        "plain English (ODbL licence text)": (MEDS_DIR / "LICENSE.txt").read_text(),
        "task instructions (all tasks)": "\n\n".join(tasks),
    }


def smollm2_tokenizer() -> Path:
    """SmolLM2's tokenizer.json (the committed test fixture, unpacked)."""
    import gzip

    out = project_root() / ".cache" / "bench" / "smollm2-tokenizer.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    src = project_root() / "tests" / "fixtures" / "tokenizers" / "smollm2" / "tokenizer.json.gz"
    out.write_bytes(gzip.decompress(src.read_bytes()))
    return out


def rotation(k: int) -> dict[int, int]:
    """The digit rotation of repetition `k` (0 leaves the digits unchanged)."""
    return str.maketrans("0123456789", "".join(str((d + k) % 10) for d in range(10)))


def write_shards(out: Path, n_shards: int) -> Path:
    """A MEDS dataset of `n_shards` data shards, shard k = the demo's events with subject ids
    moved by k * SUBJECT_OFFSET and the digits of every numeric value rotated by k."""
    events = pq.read_table(MEDS_DIR / "data" / "events.parquet")
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "metadata").mkdir(exist_ok=True)
    codes = out / "metadata" / "codes.parquet"
    if not codes.exists():
        codes.symlink_to(MEDS_DIR / "metadata" / "codes.parquet")
    values = events.column("numeric_value").to_pylist()
    for k in range(n_shards):
        path = out / "data" / f"shard_{k:04d}.parquet"
        if path.exists():
            continue
        table = rotation(k)
        rotated = [None if v is None else float(repr(v).translate(table)) for v in values]
        shard = events.set_column(
            0, "subject_id", pc.add(events.column("subject_id"), k * SUBJECT_OFFSET)
        ).set_column(3, "numeric_value", pa.array(rotated, pa.float32()))
        pq.write_table(shard, path)
    return out
