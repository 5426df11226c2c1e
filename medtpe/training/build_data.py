"""The data steps of `medtpe build-artefact`: prediction times (a MEDS label file, or windows
inside intervals), the SSFT samples (`PredictionPoint`s with a task and a budget: the build's
windows), and their prompts rendered shard by shard (never the whole dataset in memory)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from medtpe.core.meds.prediction_point import PredictionPoint, write_points
from medtpe.core.meds.readers import (
    MedsDataset,
    MedsFormatError,
    data_shards,
    read_prediction_times,
)
from medtpe.core.prompt import ChatTemplate, build_prompt
from medtpe.core.tasks import get_task
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.corpus import CorpusSpec
from medtpe.training.build_config import BuildConfig, Windows

SUBJECT_ID = "subject_id"
PREDICTION_TIME = "prediction_time"


def window_times(windows: Windows) -> list[tuple[int, datetime]]:
    """(subject, time) at each of `windows.hours` after an interval's start, before its end,
    intervals in (subject, start) order."""
    try:
        table = pq.read_table(windows.table, columns=[SUBJECT_ID, windows.start, windows.end])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise MedsFormatError(f"{windows.table}: {exc}") from exc
    rows = sorted(table.to_pylist(), key=lambda r: (r[SUBJECT_ID], r[windows.start]))
    times = []
    for row in rows:
        for hours in windows.hours:
            time = row[windows.start] + timedelta(hours=hours)
            if time < row[windows.end]:
                times.append((row[SUBJECT_ID], time))
    return times


def prediction_times(config: BuildConfig) -> list[tuple[int, datetime]]:
    """The build's (subject, prediction time) pairs."""
    if config.windows is not None:
        return window_times(config.windows)
    labels = config.labels or CorpusSpec(config.meds).labels_path
    if labels is None:
        raise MedsFormatError(f"{config.meds}: no labels/ (give --labels or windows)")
    return read_prediction_times(labels)


def assign_tasks(
    times: Sequence[tuple[int, datetime]], tasks: Sequence[str]
) -> list[PredictionPoint]:
    """The times alternate between `tasks`; grouped by task (each task's share in order)."""
    return [
        PredictionPoint(subject, time, task=task)
        for index, task in enumerate(tasks)
        for subject, time in times[index :: len(tasks)]
    ]


def sample(windows: Sequence[PredictionPoint], n: int, seed: int) -> list[PredictionPoint]:
    """A seeded sample of `n` windows (all when there are fewer)."""
    return random.Random(seed).sample(list(windows), min(n, len(windows)))


def write_label_file(path: Path, times: Sequence[tuple[int, datetime]]) -> Path:
    """A MEDS label file (no values) with these prediction times (the mining corpus's)."""
    table = pa.table(
        {
            SUBJECT_ID: pa.array([s for s, _ in times], pa.int64()),
            PREDICTION_TIME: pa.array([t for _, t in times], pa.timestamp("us")),
        }
    )
    pq.write_table(table, path)
    return path


def with_budgets(
    windows: Sequence[PredictionPoint], budgets: Sequence[int]
) -> list[PredictionPoint]:
    """The windows with `budgets` cycled over them (the SSFT length mix)."""
    return [replace(w, budget=budgets[k % len(budgets)]) for k, w in enumerate(windows)]


def render_windows(
    config: BuildConfig, windows: Sequence[PredictionPoint], out: Path, desc: str
) -> list[dict[str, Any]]:
    """Render the prompts of `windows` (each at its budget) into JSONL `out`, one data shard at
    a time; lines in `windows` order. Returns the lines."""
    tokenizer = BaseTokenizer.load(config.base)
    template = ChatTemplate.from_model_dir(config.base)
    wanted: dict[int, list[int]] = {}
    for index, window in enumerate(windows):
        wanted.setdefault(window.subject_id, []).append(index)
    extras: list[dict[str, Any]] = [{} for _ in windows]
    bar = tqdm(total=len(windows), desc=desc, unit="record")
    for shard in data_shards(config.meds):
        dataset = MedsDataset.load(config.meds, [shard])
        for subject in set(dataset.subject_ids).intersection(wanted):
            for index in wanted.pop(subject):
                extras[index] = _render(dataset, windows[index], tokenizer, template, config)
                bar.update(1)
    bar.close()
    if wanted:
        raise MedsFormatError(f"subject {min(wanted)} has prediction times but no data shard")
    write_points(out, windows, extras)
    return [w.to_json() | extra for w, extra in zip(windows, extras, strict=True)]


def _render(
    dataset: MedsDataset,
    window: PredictionPoint,
    tokenizer: BaseTokenizer,
    template: ChatTemplate,
    config: BuildConfig,
) -> dict[str, Any]:
    prompt = build_prompt(
        get_task(window.task),
        dataset.events(window.subject_id),
        window.prediction_time,
        tokenizer,
        template,
        window.budget or config.max_input_tokens,
        dataset.descriptions,
    )
    return {
        "prompt": prompt.text,
        "text": prompt.record_text,
        "n_tokens_original": prompt.n_tokens_original,
    }
