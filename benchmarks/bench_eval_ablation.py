"""Ablations of the paper's Table 3 on the default artefact.

- Without SSFT: the default artefact's tokenizer with its new rows only initialised (mean of the
  constituents' embeddings, rescaled to α·μ), untrained. The script writes that artefact
  (tokenizer files copied, rows from `training.embedding_init.init_new_rows`), runs
  `medtpe evaluate --mode medtpe` on it (`bench_eval_compare.py` then compares its answers with
  a Table-2 report's, same records and budget).
- Without replacement (the paper's vocabulary expansion: new rows appended, no base token
  evicted): on a record where no evicted base token occurs, replacement and expansion feed the
  model the same token sequence up to the ids' names, and the same embedding rows, so their
  answers are identical. The script counts evicted-token occurrences in the evaluated prompts;
  `bench_eval_no_replacement.py` evaluates the extension twin itself.

    .venv/bin/python benchmarks/bench_eval_ablation.py --work .cache/eval/ablation \\
        --subjects 10002428,... --max-input-tokens 4096 \\
        --out benchmarks/results/eval_ablation_no_ssft.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from evaluation.records import load_records
from medtpe_core.chat_template import ChatTemplate
from medtpe_core.meds_readers import read_code_descriptions
from medtpe_core.paths import default_artefact_dir, default_model_dir
from medtpe_core.prompting import build_prompt
from medtpe_core.tasks import get_task
from medtpe_core.tokenizer import MedTPETokenizer
from training.export import EMBEDDINGS_FILE, model_fingerprint, save_rows

SHARED_MEDS = Path("../shared/data/mimic-iv-demo-meds")


def copy_tokenizer_files(source: Path, out_dir: Path) -> None:
    """Every file of artefact `source` but its trained rows, into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != EMBEDDINGS_FILE:
            shutil.copyfile(path, out_dir / path.name)


def init_only_artefact(source: Path, model_dir: Path, out_dir: Path) -> Path:
    """A copy of `source` whose new rows are the initialisation, untrained."""
    from transformers import AutoModelForCausalLM

    from training.embedding_init import init_new_rows

    copy_tokenizer_files(source, out_dir)
    tokenizer = MedTPETokenizer.load(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    save_rows(out_dir, init_new_rows(model, tokenizer.new_tokens), model_fingerprint(model))
    return out_dir


def evicted_occurrences(args: argparse.Namespace, artefact: Path) -> dict[str, int]:
    """Base tokens of the evaluated prompts, and how many of them are evicted tokens."""
    tokenizer = MedTPETokenizer.load(artefact)
    template = ChatTemplate.from_model_dir(default_model_dir())
    task = get_task(args.task)
    descriptions = read_code_descriptions(args.meds)
    n_tokens = n_evicted = 0
    for record in load_records(args.meds, args.labels, task, subjects=args.subject_set):
        prompt = build_prompt(
            task,
            record.events,
            record.prediction_time,
            tokenizer.base,
            template,
            args.max_input_tokens,
            descriptions,
        )
        ids = tokenizer.base_encode(prompt.text, special_tokens=True)
        n_tokens += len(ids)
        n_evicted += sum(i in tokenizer.evicted for i in ids)
    return {"prompt_tokens": n_tokens, "evicted_token_occurrences": n_evicted}


def main() -> None:
    """Build the init-only artefact, evaluate it, count evicted-token occurrences."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="artefact and export go here")
    parser.add_argument("--artefact", type=Path, default=None)
    parser.add_argument("--meds", type=Path, default=SHARED_MEDS)
    parser.add_argument("--task", default="icu_mortality")
    parser.add_argument("--subjects", required=True, help="comma-separated subject ids")
    parser.add_argument("--max-input-tokens", type=int, default=4096)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.labels = args.meds / "labels" / f"{args.task}.parquet"
    args.subject_set = {int(s) for s in args.subjects.split(",")}
    source = args.artefact or default_artefact_dir()
    artefact = init_only_artefact(source, default_model_dir(), args.work / "artefact")
    command = [str(Path(sys.executable).with_name("medtpe")), "evaluate", "--mode", "medtpe"]
    command += ["--meds", str(args.meds), "--labels", str(args.labels), "--task", args.task]
    command += ["--subjects", args.subjects, "--max-input-tokens", str(args.max_input_tokens)]
    command += ["--max-new-tokens", str(args.max_new_tokens)]
    command += ["--artefact", str(artefact), "--export-dir", str(args.work / "export")]
    command += ["--out", str(args.out)]
    subprocess.run(command, check=True)
    report = json.loads(args.out.read_text())
    report["without_replacement"] = evicted_occurrences(args, source)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "records"}, indent=2))


if __name__ == "__main__":
    main()
