"""An experiment on the default artefact's distillation (docs/research/fidelity-log.md, "The
answer's KL on the prompts' last windows"): the long windows' stage run on each prompt's *last*
window only (the one ending at the answer position, where the KL reads p("yes")) with a heavy
answer KL, instead of windows drawn from anywhere in the prompts; from the short snippets' best
rows of a kept build work directory. Writes the rows into a copy of its tokenizer artefact,
for `bench_fidelity diagnose --rows NAME=OUT:base`.

    python -m tools.research.bench_distill_answer_windows --weight 100 --out .cache/exp/w100

`--unmerged-tail K` leaves each window's last K ids unmerged on the student's side
(`MedTPETokenizer.plain_tail`: rows for prompts served so; read them with `bench_fidelity
diagnose --plain-tail K`); `--windows N` keeps the first N training windows (the CPU's budget).
The build now runs this stage itself (`long_windows: last` with `plain_tail`, the default
artefact's `build.yaml`); this script tries other weights and tails on a kept work directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.snippets import cut, opening
from medtpe.training.build_artefact import DISTILL_RUNS, TOKENIZER_DIR
from medtpe.training.build_config import build_config
from medtpe.training.distill_config import long_stage
from medtpe.training.embedding_init import NewRows
from medtpe.training.export import base_model_fingerprint, save_rows
from medtpe.training.ssft_pipeline import read_records
from medtpe.training.token_distillation import best_rows, distill, summary

DEFAULT_WORK = Path(".cache/artefacts/distill-stretch/.build")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, default=Path("artefacts/smollm2-135m-icu/build.yaml")
    )
    parser.add_argument("--base", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="a kept build work dir")
    parser.add_argument("--weight", type=float, default=100.0, help="the answer KL's weight")
    parser.add_argument("--unmerged-tail", type=int, default=0, help="original tokens at the end")
    parser.add_argument("--windows", type=int, default=None, help="training windows kept")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = build_config(args.config, {"base": args.base})
    settings = config.distill
    stage = long_stage(settings)
    assert stage is not None, "the build settings have no long windows' stage"
    tokenizer = MedTPETokenizer.load(args.work / TOKENIZER_DIR)
    windows = {}
    for split in ("train", "val"):
        prompts = [r["prompt"] for r in read_records(args.work / f"{split}.jsonl")]
        encoded = [tokenizer.base_encode(p, special_tokens=True) for p in prompts]
        windows[split] = [
            cut(
                tokenizer,
                ids,
                stage.snippet_tokens,
                opening(tokenizer, ids),
                tail=True,
                unmerged_tail=args.unmerged_tail,
            )[-1]
            for ids in encoded
            if len(ids) >= stage.snippet_tokens
        ]
    windows["train"] = windows["train"][: args.windows]
    n_train, n_val = len(windows["train"]), len(windows["val"])
    stage = replace(stage, last_kl_weight=args.weight, snippets=n_train, val_snippets=n_val)
    stage = replace(stage, eval_every=max(1, n_train // 4))
    short_rows = best_rows(args.work / "runs" / DISTILL_RUNS[0])
    initial = NewRows(short_rows, rope_stretch=settings.rope_stretch)
    started = time.perf_counter()
    result = distill(
        args.base, tokenizer, windows["train"], windows["val"], args.out / "run", stage, initial
    )
    record = summary(result, stage) | {"seconds_all": time.perf_counter() - started}
    artefact = args.out / "artefact"
    if not artefact.is_dir():
        shutil.copytree(args.work / TOKENIZER_DIR, artefact)
    save_rows(artefact, result.rows, base_model_fingerprint(args.base))
    (args.out / "summary.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
