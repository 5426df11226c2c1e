"""`medtpe ssft` end to end: prompts → pseudo-labelled examples (cached in the run directory)
→ SSFT → the best rows written into the artefact's `embeddings.safetensors`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medtpe.core.meds.subject_split import TRAIN, seeded_split
from medtpe.training.embedding_split import EXTENSION_UNSUPPORTED
from medtpe.training.examples import Example, build_examples, load_examples, save_examples
from medtpe.training.export import base_model_fingerprint, save_rows
from medtpe.training.ssft import SSFTConfig, SSFTResult, train_ssft

if TYPE_CHECKING:
    from medtpe.core.tokenizer import MedTPETokenizer

SUMMARY_FILE = "summary.json"


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a `medtpe render` file (each has at least `prompt`)."""
    with Path(path).open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def split_by_subject(
    records: Sequence[dict[str, Any]], fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Hold out `fraction` of the subjects (`subject_id`) for validation, as
    `medtpe.core.meds.subject_split.seeded_split` does (a line without `subject_id` is a subject of
    its own). Returns (train, validation), each in file order."""
    keys = [r.get("subject_id", -1 - i) for i, r in enumerate(records)]
    split = seeded_split(keys, fraction, seed)
    train = [r for r, k in zip(records, keys, strict=True) if split.split_of(k) == TRAIN]
    val = [r for r, k in zip(records, keys, strict=True) if split.split_of(k) != TRAIN]
    return train, val


def examples_path(run_dir: Path, artefact_id: str, split: str) -> Path:
    """Where a run caches its pseudo-labelled `split` ("train"/"val") examples."""
    return run_dir / f"examples-{artefact_id}-{split}.jsonl"


def cached_examples(
    splits: Mapping[str, tuple[Path, Sequence[str]]],
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    max_new_tokens: int,
    eos_id: int | None = None,
) -> dict[str, list[Example]]:
    """Pseudo-labelled examples of each split's prompts ({split: (cache file, prompts)}), read
    from the cache file where it exists; the missing splits are labelled together, by one
    engine start (tens of seconds on a CPU), and cached."""
    missing = [split for split, (path, _) in splits.items() if not path.is_file()]
    prompts = [p for split in missing for p in splits[split][1]]
    made = iter(
        build_examples(base_dir, tokenizer, prompts, max_new_tokens, eos_id) if prompts else []
    )
    examples = {}
    for split, (path, split_prompts) in splits.items():
        if split in missing:
            examples[split] = list(itertools.islice(made, len(split_prompts)))
            save_examples(path, examples[split])
        else:
            examples[split] = load_examples(path)
    return examples


def run_ssft(
    base_dir: Path,
    artefact_dir: Path,
    train_prompts: Sequence[str],
    val_prompts: Sequence[str],
    run_dir: Path,
    config: SSFTConfig,
    max_new_tokens: int = 64,
    out_dir: Path | None = None,
    resume: bool = True,
) -> SSFTResult:
    """Pseudo-label, train, and save the best rows to `out_dir` (default: the artefact)."""
    from medtpe.core.tokenizer import MedTPETokenizer

    tokenizer = MedTPETokenizer.load(artefact_dir)
    if tokenizer.is_extension:  # fail before the pseudo-labelling, not after
        raise ValueError(f"{artefact_dir}: {EXTENSION_UNSUPPORTED}")
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = tokenizer.artefact_id
    prompts = {"train": train_prompts, "val": val_prompts}
    examples = cached_examples(
        {split: (examples_path(run_dir, tag, split), p) for split, p in prompts.items()},
        base_dir,
        tokenizer,
        max_new_tokens,
    )
    train, val = examples["train"], examples["val"]
    result = train_ssft(base_dir, tokenizer, train, val, run_dir, config, resume=resume)
    save_rows(out_dir or artefact_dir, result.rows, base_model_fingerprint(base_dir))
    summary = {
        "artefact_id": tag,
        "n_train": len(train),
        "n_val": len(val),
        "initial_val_loss": result.initial_val_loss,
        "best_val_loss": result.best_val_loss,
        "best_val": result.best_val,
        "steps": result.steps,
        "stopped_early": result.stopped_early,
    }
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return result
