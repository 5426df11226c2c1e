"""The "without replacement" row of the paper's Table 3: `medtpe evaluate --mode medtpe` on the
extension twin of a MedTPE artefact (same new tokens and trained rows on fresh ids after the
base vocabulary, nothing evicted; `training.extension`).

The twin is derived into the cache (`--work`, default `.cache/eval/no-replacement/<artefact
id>`: `artefact/`, and `export/`, written by the evaluation when missing or stale); every other
option is `medtpe evaluate`'s and goes to it unchanged. The report gets a `without_replacement`
entry naming both artefacts; `bench_eval_compare.py` compares its answers with a Table-2 run's.

    .venv/bin/python benchmarks/bench_eval_no_replacement.py \\
        --meds ../shared/data/mimic-iv-demo-meds \\
        --labels ../shared/data/mimic-iv-demo-meds/labels/icu_mortality.parquet \\
        --task icu_mortality --subjects 10002428,... --max-input-tokens 4096 \\
        --out benchmarks/results/eval_ablation_no_replacement.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from medtpe_cli.evaluation_commands import evaluate
from medtpe_core.paths import cache_dir, default_artefact_dir

SET_HERE = ("mode", "artefact_dir", "export_dir")
"""`medtpe evaluate` options this script sets itself: the twin, in medtpe mode."""


@click.command(
    params=[p for p in evaluate.params if p.name not in SET_HERE],
    context_settings={"help_option_names": ["-h", "--help"]},
    help=__doc__.split("\n\n")[0],
)
@click.option(
    "--medtpe",
    "source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Replacement MedTPE artefact (default: the default artefact).",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The twin's artefact and export (default: the cache's eval/no-replacement/<id>).",
)
@click.pass_context
def main(ctx: click.Context, source: Path | None, work: Path | None, **options: Any) -> None:
    """Derive the twin, evaluate it in medtpe mode, note both artefacts in the report."""
    from medtpe_core.tokenizer import MedTPETokenizer
    from training.extension import write_extension_artefact

    source = source or default_artefact_dir()
    replacement = MedTPETokenizer.load(source)
    work = work or cache_dir() / "eval" / "no-replacement" / replacement.artefact_id
    twin = write_extension_artefact(source, work / "artefact", options["model_dir"])
    click.echo(f"extension twin {twin.artefact_id} of {replacement.artefact_id}: {work}")
    ctx.invoke(
        evaluate,
        mode="medtpe",
        artefact_dir=work / "artefact",
        export_dir=work / "export",
        **options,
    )
    out: Path = options["out_path"]
    report = json.loads(out.read_text())
    report["without_replacement"] = {
        "replacement_artefact": str(source),
        "replacement_artefact_id": replacement.artefact_id,
        "extension_artefact_id": twin.artefact_id,
        "vocab_size": twin.vocab_size,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
