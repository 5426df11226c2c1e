"""An artefact from an SSFT run's last checkpoint: the artefact's tokenizer files with the best
rows validated so far (`checkpoint.pt`'s `best_rows`), e.g. to evaluate a run before it ends:

    .venv/bin/python benchmarks/bench_eval_checkpoint_artefact.py \\
        --run-dir .cache/artefact-build/run-ce --out .cache/eval/artefact-ckpt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_eval_ablation import copy_tokenizer_files
from transformers import AutoModelForCausalLM

from medtpe_core.paths import default_artefact_dir, default_model_dir
from training.export import model_fingerprint, save_rows
from training.ssft import CHECKPOINT_FILE


def main() -> None:
    """Write the artefact; print the checkpoint's step and validation losses."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--artefact", type=Path, default=None, help="tokenizer files from here")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    state = torch.load(args.run_dir / CHECKPOINT_FILE, map_location="cpu", weights_only=False)
    copy_tokenizer_files(args.artefact or default_artefact_dir(), args.out)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype="auto")
    save_rows(args.out, state["best_rows"], model_fingerprint(model))
    print(
        f"step {state['step']}: validation loss {state['initial_val_loss']:.4f} -> "
        f"best {state['best_val_loss']:.4f}; artefact {args.out}"
    )


if __name__ == "__main__":
    main()
