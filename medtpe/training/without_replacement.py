"""The "without replacement" ablation's artefact (paper, Table 3), with its rows.

`write_extension_artefact` derives the extension twin of a trained replacement artefact
(`medtpe.core.tokenizer.without_replacement`: the same new tokens on fresh ids V, V+1, ..., nothing
evicted) and carries its trained rows over unchanged, row i still for new token i. The twin's
fallback bytes get the rows the replacement checkpoint gives them: the base rows of the ids they
evicted. Evaluating both artefacts then isolates the effect of replacement itself: with the same
trained rows, the twin keeps the evicted rare tokens in the input (their own rows) and in the
softmax. SSFT of the twin itself is not supported
(`medtpe.training.embedding_split.EXTENSION_UNSUPPORTED`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.without_replacement import extension_twin
from medtpe.training.embedding_init import NewRows, with_output_rows
from medtpe.training.export import EMBEDDINGS_FILE, check_fingerprint, load_rows, save_rows


def write_extension_artefact(
    source_dir: Path, out_dir: Path, base_dir: Path | None = None
) -> MedTPETokenizer:
    """Write the extension twin of the replacement artefact `source_dir` into `out_dir`, with
    `source_dir`'s rows (when it has any) and, for the byte fallback, rows read from the base
    model `base_dir` (default: the default model, prepared on first use). Returns the twin."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    if out_dir.resolve() == source_dir.resolve():
        raise ValueError("the extension twin needs its own directory")
    source = MedTPETokenizer.load(source_dir)
    twin = extension_twin(source)
    twin.save(out_dir)
    (out_dir / EMBEDDINGS_FILE).unlink(missing_ok=True)
    if (source_dir / EMBEDDINGS_FILE).is_file():
        rows, fingerprint = load_rows(source_dir)
        if source.byte_fallback or rows.output_base:
            rows = _twin_rows(source, rows, fingerprint, source_dir, base_dir)
        save_rows(out_dir, rows, fingerprint)
    return twin


def _twin_rows(
    source: MedTPETokenizer,
    rows: NewRows,
    fingerprint: str,
    source_dir: Path,
    base_dir: Path | None,
) -> NewRows:
    """`rows` with an output side that is the base head's (`NewRows.output_base`) read from the
    base model (the twin's fresh ids have no base rows of their own), followed by the base
    model's rows (input, and untied head) at `source`'s byte-fallback ids, in byte order."""
    from transformers import AutoModelForCausalLM

    if base_dir is None:
        from medtpe.training.default_model import prepare_default_model

        base_dir = prepare_default_model()
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    check_fingerprint(model, fingerprint, source_dir)
    rows = with_output_rows(rows, model, [token.id for token in source.new_tokens])
    ids = torch.tensor(list(source.byte_fallback.values()), dtype=torch.long)

    def extended(new: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.cat([new.float(), weight.detach()[ids].float()])

    embedding = model.get_input_embeddings().weight
    output = None
    if rows.output is not None:
        output = extended(rows.output, model.get_output_embeddings().weight)
    return replace(rows, input=extended(rows.input, embedding), output=output)
