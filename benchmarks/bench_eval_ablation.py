"""Ablation (the paper's Table 3), "without SSFT": the default artefact's tokenizer with its new
rows only initialised (mean of the constituents' embeddings, rescaled to α·μ), not trained.

Writes that artefact (tokenizer files copied, `embeddings.safetensors` from
`training.embedding_init.init_new_rows`) and runs `medtpe evaluate --mode medtpe` on it with the
arguments given after `--`, e.g.

    .venv/bin/python benchmarks/bench_eval_ablation.py --work .cache/eval/ablation -- \\
        --meds ../shared/data/mimic-iv-demo-meds \\
        --labels ../shared/data/mimic-iv-demo-meds/labels/icu_mortality.parquet \\
        --task icu_mortality --subjects 10002428,... --max-input-tokens 4096 \\
        --out benchmarks/results/eval_ablation_no_ssft.json
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from medtpe_core.paths import default_artefact_dir, default_model_dir
from medtpe_core.tokenizer import MedTPETokenizer
from training.export import EMBEDDINGS_FILE, model_fingerprint, save_rows


def init_only_artefact(source: Path, model_dir: Path, out_dir: Path) -> Path:
    """A copy of `source` whose new rows are the initialisation, untrained."""
    from transformers import AutoModelForCausalLM

    from training.embedding_init import init_new_rows

    out_dir.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != EMBEDDINGS_FILE:
            shutil.copyfile(path, out_dir / path.name)
    tokenizer = MedTPETokenizer.load(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    save_rows(out_dir, init_new_rows(model, tokenizer.new_tokens), model_fingerprint(model))
    return out_dir


def main() -> None:
    """Build the init-only artefact, then evaluate it in medtpe mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="artefact and export go here")
    parser.add_argument("--artefact", type=Path, default=None)
    parser.add_argument("evaluate_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    artefact = init_only_artefact(
        args.artefact or default_artefact_dir(), default_model_dir(), args.work / "artefact"
    )
    extra = [a for a in args.evaluate_args if a != "--"]
    medtpe = Path(sys.executable).with_name("medtpe")
    command = [str(medtpe), "evaluate", "--mode", "medtpe", "--artefact", str(artefact)]
    command += ["--export-dir", str(args.work / "export"), *extra]
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
