"""How much shorter the served prompts get with a shorter plain tail: the default artefact's
merges, its `record-first` rendering at the served budget, each window's prompt in MedTPE ids with
the last `k` ids of the record left unmerged (`MedTPETokenizer.plain_tail`), the task's text after
the record as served (unmerged) or merged on its own (the shared part unchanged either way).
Tokenizer only, no engine: what each tail costs in tokens, not what the model answers with it
(docs/research/fidelity-log.md has the 256-token tail's fidelity against none).

    .venv/bin/python -m tools.research.plain_tail_served --tails 0,64,128,256 \\
        --out tools/research/results/plain_tail_served.json

The windows are the build's (`build.yaml`: its ICU windows, 6-120 h after admission), of the
training patients (the choice is made there) and, apart, of the held-out ones (the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from medtpe.core.meds import MedsDataset
from medtpe.core.paths import default_artefact_dir, default_model_dir
from medtpe.core.tasks import get_task
from medtpe.inference.model import ModelConfig, load_model
from medtpe.training.build_config import build_config
from medtpe.training.build_data import prediction_times
from tools.benchmarks.results_file import write_results

TASK = "icu_mortality"


def served_rates(artefact: Path, tails: list[int]) -> dict[str, dict[str, dict]]:
    """Per set of the build's windows (training patients, held-out ones) and per tail: original
    and MedTPE tokens, the task's text unmerged (as served) or merged apart. The artefact, its
    model and the dataset are loaded once for both sets."""
    config = build_config(artefact / "build.yaml", {"base": str(default_model_dir())})
    held = set(json.loads((artefact / "build_report.json").read_text())["held_out_subjects"])
    predictor = load_model(ModelConfig(artefact_dir=artefact)).predictor
    tokenizers = {k: predictor.tokenizer.with_settings(plain_tail=k) for k in tails}
    dataset = MedsDataset.load(Path(config.meds))
    task = get_task(TASK)
    points = prediction_times(config)
    results = {}
    for name, held_out in (("training windows", False), ("held-out windows", True)):
        chosen = [(s, t) for s, t in points if (s in held) == held_out]
        original = 0
        served = dict.fromkeys(tails, 0)
        tail_merged = dict.fromkeys(tails, 0)
        for subject, when in tqdm(chosen, desc=name, unit="window"):
            prepared = predictor.prepare(task, dataset.events(subject), when)
            prompt = prepared.prompt
            original += len(prompt.shared_ids) + len(prompt.tail_ids)
            # the artefact's own tail gives the served prompt
            assert len(prepared.segmentation.medtpe_ids) == len(
                prompt.medtpe_ids(predictor.tokenizer)
            )
            for k, tok in tokenizers.items():
                shared = prompt.shared_medtpe_ids(tok)
                served[k] += len(shared) + len(prompt.tail_ids)
                tail_merged[k] += len(shared) + len(tok.encode_ids(prompt.tail_ids, plain_tail=0))
        results[name] = {
            str(k): {
                "windows": len(chosen),
                "budget": predictor.max_input_tokens,
                "original_tokens": original,
                "served_tokens": served[k],
                "shorter_served": round(1 - served[k] / original, 4),
                "shorter_task_text_merged": round(1 - tail_merged[k] / original, 4),
            }
            for k in tails
        }
    return results


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artefact", type=Path, default=default_artefact_dir())
    parser.add_argument("--tails", default="0,64,128,256", help="Plain tails, comma-separated.")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tails = [int(k) for k in args.tails.split(",")]
    results = served_rates(args.artefact, tails)
    for name, rows in results.items():
        for k, row in rows.items():
            print(name, "tail", k, row, flush=True)
    write_results(args.out, " ".join(sys.argv), results)


if __name__ == "__main__":
    main()
