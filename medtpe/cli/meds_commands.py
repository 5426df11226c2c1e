"""`medtpe render`: MEDS dataset + label file -> one JSON line per label row (record and prompt)."""

from __future__ import annotations

from pathlib import Path

import click

from medtpe.cli.options import ALL_SPLITS, BASE_TOKENIZER, MEDS_DIR_OPTION, TASK, split_option
from medtpe.core.prompt.task_prompt import DEFAULT_MAX_INPUT_TOKENS


@click.command("render")
@MEDS_DIR_OPTION
@click.option(
    "--labels",
    "labels_path",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="MEDS label file (or a directory of them).",
)
@click.option(
    "--task",
    "task_name",
    required=True,
    type=TASK,
    help="Task name (see medtpe/core/tasks, $MEDTPE_TASKS_DIR).",
)
@click.option(
    "--base",
    "base_path",
    required=True,
    type=BASE_TOKENIZER,
    help="Base tokenizer: a tokenizer.json or a model dir (its chat template is used too).",
)
@click.option(
    "--chat-template",
    "template_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Model dir whose chat template to use (default: --base if a dir, else the default model).",
)
@click.option(
    "--max-input-tokens",
    default=DEFAULT_MAX_INPUT_TOKENS,
    show_default=True,
    type=click.IntRange(1),
    help="Whole-prompt budget in ORIGINAL tokenizer tokens.",
)
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output JSON-lines file.",
)
@split_option(ALL_SPLITS, ", e.g. 'tuning' for an SSFT validation corpus")
def render(
    meds_dir: Path,
    labels_path: Path,
    task_name: str,
    base_path: Path,
    template_dir: Path | None,
    max_input_tokens: int,
    out_path: Path,
    split: str,
) -> None:
    """Render each label row's record and prompt (events up to and including its prediction
    time)."""
    from dataclasses import replace

    from tqdm import tqdm

    from medtpe.core.meds import MedsDataset, read_labels
    from medtpe.core.meds.prediction_point import write_points
    from medtpe.core.meds.subject_split import subject_split
    from medtpe.core.paths import default_model_dir
    from medtpe.core.prompt import ChatTemplate, build_prompt
    from medtpe.core.tasks import get_task
    from medtpe.core.tokenizer import BaseTokenizer

    task = get_task(task_name)
    tokenizer = BaseTokenizer.load(base_path)
    template = ChatTemplate.from_model_dir(
        template_dir or (base_path if base_path.is_dir() else default_model_dir())
    )
    dataset = MedsDataset.load(meds_dir)
    points = read_labels(labels_path)
    if split != ALL_SPLITS:
        by_split = subject_split(meds_dir, (p.subject_id for p in points))
        points = [p for p in points if by_split.keeps(p.subject_id, split)]
        click.echo(f"split {split} ({by_split.source}): {len(points)} records", err=True)
    known = set(dataset.subject_ids)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rendered, extras = [], []
    for i, point in enumerate(tqdm(points, desc="render", unit="record")):
        if point.subject_id not in known:
            raise click.ClickException(
                f"label row {i}: subject {point.subject_id} is not in {meds_dir}"
            )
        try:
            labelled = replace(point.parsed(task), task=task.name, budget=max_input_tokens)
        except ValueError as exc:
            raise click.ClickException(f"label row {i}: {exc}") from exc
        prompt = build_prompt(
            task,
            dataset.events(point.subject_id),
            point.prediction_time,
            tokenizer,
            template,
            max_input_tokens,
            dataset.descriptions,
        )
        rendered.append(labelled)
        extras.append(
            {
                "text": prompt.record_text,
                "prompt": prompt.text,
                "n_tokens_original": prompt.n_tokens_original,
                "n_events_total": prompt.n_events_total,
                "n_events_kept": prompt.n_events_kept,
            }
        )
    write_points(out_path, rendered, extras)
    click.echo(f"wrote {len(points)} records to {out_path}", err=True)


commands = [render]
