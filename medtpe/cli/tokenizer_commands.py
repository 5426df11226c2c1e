"""`medtpe build-tokenizer`, `medtpe add-byte-fallback` and `medtpe tokenize` (torch-free)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import click

from medtpe.cli.options import ARTEFACT_DIR, BASE_TOKENIZER
from medtpe.cli.ray_option import ray_option
from medtpe.core.tokenizer.build import DEFAULT_METHOD, METHODS, default_protected_texts


def _jsonl_texts(path: Path) -> Iterator[str]:
    """The `text` of each line of the JSONL corpus `path`; a line that is not a JSON object with
    a `text` is a usage error naming `--corpus` and the line."""
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield _line_text(line, f"{path} line {number}")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{path} is not UTF-8 text ({exc})", param_hint="--corpus"
        ) from exc


def _line_text(line: str, where: str) -> str:
    """The `text` of a corpus line (`where`: its file and number, for the usage error)."""
    try:
        return json.loads(line)["text"]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(
            f'{where}: not a JSON object with a "text" ({exc!r})', param_hint="--corpus"
        ) from exc


@click.command("build-tokenizer")
@click.option(
    "--base",
    "base_path",
    required=True,
    type=BASE_TOKENIZER,
    help="Base tokenizer.json, or a model directory holding one.",
)
@click.option(
    "--corpus",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help='JSONL file with a "text" field per line, or a MEDS dataset directory.',
)
@click.option("--budget", default=5000, show_default=True, help="Number of new TPE tokens (M).")
@click.option("--max-n", default=2, show_default=True, help="Longest new token, in base tokens.")
@click.option("--method", type=click.Choice(METHODS), default=DEFAULT_METHOD, show_default=True)
@click.option(
    "--max-tokens",
    type=int,
    default=None,
    help="MEDS corpus: cut each record to its newest N original tokens, as prompts do.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="MEDS corpus: worker processes rendering and counting data shards in parallel "
    "(the artefact is the same for any number).",
)
@ray_option("the MEDS corpus's shard mining (the artefact is the same as without)")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Artefact directory.")
def build_tokenizer(
    base_path: Path,
    corpus: Path,
    budget: int,
    max_n: int,
    method: str,
    max_tokens: int | None,
    workers: int,
    ray_address: str | None,
    out: Path,
) -> None:
    """Mine a MedTPE vocabulary from a corpus and write the artefact directory."""
    from medtpe.core.ray_cluster import RayUnavailableError, check_ray_installed
    from medtpe.core.tokenizer.build import build_tokenizer as build
    from medtpe.core.tokenizer.build import build_tokenizer_from_meds
    from medtpe.core.tokenizer.corpus import CorpusSpec

    started = time.perf_counter()
    protected = default_protected_texts(base_path)
    if corpus.is_dir():
        if ray_address is not None and workers > 1:
            raise click.UsageError("--workers and --ray exclude each other (Ray runs the shards)")
        spec = CorpusSpec(corpus, max_tokens)
        try:
            if ray_address is not None:
                check_ray_installed("--ray")
            tok = build_tokenizer_from_meds(
                base_path,
                spec,
                budget,
                max_n,
                method,
                protected,
                workers=workers,
                ray_address=ray_address,
            )
        except RayUnavailableError as exc:
            raise click.UsageError(str(exc)) from exc
    elif workers > 1 or ray_address is not None:
        option = "--workers" if workers > 1 else "--ray"
        raise click.UsageError(f"{option} applies to a MEDS dataset directory, not a JSONL file")
    else:
        tok = build(base_path, _jsonl_texts(corpus), budget, max_n, method, protected)
    tok.save(out)
    stats = tok.corpus_stats
    click.echo(f"\nMedTPE artefact {tok.artefact_id} -> {out}")
    click.echo(f"  corpus: {stats['n_records']} records, {stats['n_tokens']:,} base tokens")
    click.echo(
        f"  compression on {stats['sample_tokens']:,} corpus tokens: "
        f"{stats['sample_compression_rate']:.1%}"
    )
    click.echo(
        f"  {len(tok.new_tokens)} new tokens, e.g. "
        + ", ".join(repr(tok.decode([t.id])) for t in tok.new_tokens[:8])
    )
    evicted = sorted(tok.evicted)[:8]
    click.echo(
        f"  {len(tok.evicted)} evicted base tokens, e.g. "
        + ", ".join(repr(tok.base.decode([i])) for i in evicted)
    )
    click.echo(f"  time: {time.perf_counter() - started:.1f} s")


@click.command("add-byte-fallback")
@click.option(
    "--tokenizer",
    "artefact",
    required=True,
    type=ARTEFACT_DIR,
    help="MedTPE artefact directory built without byte fallback.",
)
@click.option(
    "--corpus",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Optional corpus (JSONL or MEDS directory) to pick the cheapest tokens to evict; "
    "without it the latest base merges are evicted.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    help="Output artefact directory (the other files of --tokenizer are copied along).",
)
def add_byte_fallback(artefact: Path, corpus: Path | None, out: Path) -> None:
    """Give the bytes the base vocabulary lacks an id each (lossless on any text); new tokens and
    their ids are unchanged, so trained rows stay valid (re-export the checkpoint for its
    tokenizer.json)."""
    import shutil

    from medtpe.core.tokenizer import MedTPETokenizer
    from medtpe.core.tokenizer.build import add_byte_fallback as add

    tok = MedTPETokenizer.load(artefact)
    texts = None
    if corpus is not None and corpus.is_dir():
        from medtpe.core.tokenizer.corpus import iter_meds_corpus_texts

        texts = iter_meds_corpus_texts(corpus, tok.base, None)
    elif corpus is not None:
        texts = _jsonl_texts(corpus)
    new = add(tok, texts, default_protected_texts(artefact))
    if out.resolve() != artefact.resolve():
        shutil.copytree(artefact, out, dirs_exist_ok=True)
    new.save(out)
    click.echo(f"MedTPE artefact {tok.artefact_id} -> {new.artefact_id} at {out}")
    click.echo(
        "  byte fallback: "
        + (", ".join(f"0x{b:02X}->{i}" for b, i in new.byte_fallback.items()) or "none needed")
    )


@click.command("tokenize")
@click.option(
    "--tokenizer",
    "artefact",
    required=True,
    type=ARTEFACT_DIR,
    help="MedTPE artefact directory.",
)
@click.argument("text")
def tokenize(artefact: Path, text: str) -> None:
    """Show the base and MedTPE segmentations of TEXT side by side."""
    from medtpe.core.metrics import compression_rate
    from medtpe.core.tokenizer import MedTPETokenizer

    tok = MedTPETokenizer.load(artefact)
    base_ids, ids = tok.base_encode(text), tok.encode(text)
    base_cells = [repr(tok.base.decode([i])) for i in base_ids]
    new_ids = {t.id for t in tok.new_tokens}
    cells = [
        ("*" if i in new_ids else "") + repr(s) for i, s in zip(ids, tok.tokens(ids), strict=True)
    ]
    width = max(map(len, base_cells), default=4) + 2
    click.echo(f"{'base (' + str(len(base_ids)) + ')':<{width}}MedTPE ({len(ids)}, * = new token)")
    for k in range(max(len(base_cells), len(cells))):
        left = base_cells[k] if k < len(base_cells) else ""
        right = cells[k] if k < len(cells) else ""
        click.echo(f"{left:<{width}}{right}")
    rate = compression_rate(len(base_ids), len(ids))
    click.echo(f"compression: {rate:.1%}")


commands = [build_tokenizer, add_byte_fallback, tokenize]
