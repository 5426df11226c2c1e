"""The artefact's trained rows (`embeddings.safetensors`) and the export of a MedTPE model.

`embeddings.safetensors` holds `new_rows` [M, hidden] float32, row i for `new_tokens[i].id`
(untied models also `new_rows_output`), with the base model's fingerprint in its metadata; an
extension artefact's file also holds its byte-fallback ids' rows, after those (`row_ids`). An
output side that is the base head's own rows of the reused ids (`NewRows.output_base`) is not
stored: metadata `output_rows: base` says so, and the export reads them from the base model.
`export_checkpoint` writes a plain Hugging Face checkpoint: the base weights with the reused
rows overwritten (same config, same shapes; rows trained at a RoPE stretch, metadata
`rope_stretch`, get it as the config's `rope_parameters`) plus the artefact's tokenizer files, so
transformers and vLLM load it as any other model; `ensure_export` writes it when missing or
stale and stamps it with the artefact's digest, which the serving side checks
(`medtpe.inference.checkpoints`). For an extension artefact the input embedding
(and an untied output head) first grows to the artefact's `vocab_size` rows (V + M + fallback
bytes; `config.vocab_size` follows), the base rows kept bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, safe_open, save_file

from medtpe.core.rope_stretch import stretched_rope
from medtpe.core.tokenizer.artefact_manifest import content_digest
from medtpe.inference.checkpoints import EXPORT_STAMP, export_is_current
from medtpe.training.atomic import atomic_directory
from medtpe.training.default_model import ensure_base_model
from medtpe.training.embedding_init import NewRows, has_tied_embeddings

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from medtpe.core.tokenizer import MedTPETokenizer
    from medtpe.inference.model import ModelConfig

logger = logging.getLogger(__name__)

EMBEDDINGS_FILE = "embeddings.safetensors"
FINGERPRINT_KEY = "base_model_fingerprint"
ROPE_STRETCH_KEY = "rope_stretch"
OUTPUT_ROWS_KEY = "output_rows"
BASE_OUTPUT = "base"
"""`OUTPUT_ROWS_KEY`'s value: the output side is the base head's rows (`NewRows.output_base`)."""
# Tokenizer files an export takes from the artefact (tokenizer.json is required), else the base.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "medtpe.json",
)


class FingerprintMismatchError(ValueError):
    """The rows were trained for another base model than the one given."""


def model_fingerprint(model: PreTrainedModel) -> str:
    """sha256 (hex) of the base input embedding matrix, as float32 bytes: the rows' reference."""
    weight = model.get_input_embeddings().weight.detach().float().cpu().contiguous()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()


def base_model_fingerprint(base_dir: Path) -> str:
    """`model_fingerprint` of the checkpoint in `base_dir` (loaded in its stored dtype)."""
    from transformers import AutoModelForCausalLM

    return model_fingerprint(AutoModelForCausalLM.from_pretrained(base_dir))


def save_rows(artefact_dir: Path, rows: NewRows, base_fingerprint: str) -> Path:
    """Write `embeddings.safetensors` into the artefact directory; returns its path."""
    tensors = {"new_rows": rows.input.detach().float().cpu().contiguous()}
    if rows.output is not None:
        tensors["new_rows_output"] = rows.output.detach().float().cpu().contiguous()
    metadata = {FINGERPRINT_KEY: base_fingerprint}
    if rows.rope_stretch is not None:
        metadata[ROPE_STRETCH_KEY] = repr(float(rows.rope_stretch))
    if rows.output_base:
        metadata[OUTPUT_ROWS_KEY] = BASE_OUTPUT
    path = Path(artefact_dir) / EMBEDDINGS_FILE
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_rows(artefact_dir: Path) -> tuple[NewRows, str]:
    """The artefact's rows and the fingerprint of the base model they belong to."""
    return load_rows_file(Path(artefact_dir) / EMBEDDINGS_FILE)


def load_rows_file(path: Path) -> tuple[NewRows, str]:
    """The rows of a rows file and the fingerprint of the base model they belong to."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    stretch = metadata.get(ROPE_STRETCH_KEY)
    output_rows = metadata.get(OUTPUT_ROWS_KEY)
    if output_rows not in (None, BASE_OUTPUT):
        raise ValueError(f"{path}: {OUTPUT_ROWS_KEY} {output_rows!r}, expected {BASE_OUTPUT!r}")
    tensors = load_file(str(path))
    rows = NewRows(
        tensors["new_rows"],
        tensors.get("new_rows_output"),
        None if stretch is None else float(stretch),
        output_base=output_rows == BASE_OUTPUT,
    )
    return rows, metadata.get(FINGERPRINT_KEY, "")


def check_fingerprint(model: PreTrainedModel, fingerprint: str, artefact_dir: Path) -> None:
    """Raise `FingerprintMismatchError` unless rows with `fingerprint` (empty: unknown) were
    trained for `model`."""
    if fingerprint and fingerprint != model_fingerprint(model):
        raise FingerprintMismatchError(
            f"{artefact_dir} was trained for another base model than {model.name_or_path}"
        )


def row_ids(tokenizer: MedTPETokenizer) -> list[int]:
    """The ids of the artefact's rows, in row order: the new tokens', then for an extension
    artefact its byte-fallback ids (fresh ids need rows; a replacement artefact's fallback ids
    keep their base rows)."""
    ids = [token.id for token in tokenizer.new_tokens]
    return ids + list(tokenizer.byte_fallback.values()) if tokenizer.is_extension else ids


def grow_vocabulary(model: PreTrainedModel, size: int) -> None:
    """Give `model` `size` ids (no-op when it has as many): rows appended to the input embedding
    and an untied head (`config.vocab_size` follows), the existing rows kept bit for bit."""
    if size > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(size, mean_resizing=False)


def untie_head(model: PreTrainedModel) -> None:
    """Give a tied model its own output head, a copy of the embedding matrix (the checkpoint
    then stores `lm_head.weight` and `tie_word_embeddings: false`)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(embedding.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    if hasattr(model.config, "get_text_config"):
        model.config.get_text_config().tie_word_embeddings = False


def write_rows_into(model: PreTrainedModel, new_ids: list[int], rows: NewRows) -> None:
    """Overwrite the rows of `new_ids` (reused or fresh) of `model`'s embedding and untied head.
    Rows with an output side for a tied model (token distillation's `output: base`) untie its
    head first (`untie_head`); an output side that is the base head's (`NewRows.output_base`)
    is left as the head holds it (a tied head's copy is taken before the input rows change)."""
    tied = has_tied_embeddings(model)
    two_sided = rows.output is not None or rows.output_base
    if not tied and not two_sided:
        raise ValueError("untied models take two sets of rows (input and output)")
    if tied and two_sided:
        untie_head(model)
    if len(new_ids) != len(rows.input):
        raise ValueError(f"{len(rows.input)} rows for {len(new_ids)} ids")
    ids = torch.tensor(new_ids, dtype=torch.long)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight[ids.to(weight.device)] = rows.input.to(weight.device, weight.dtype)
        if rows.output is not None:
            head = model.get_output_embeddings().weight
            head[ids.to(head.device)] = rows.output.to(head.device, head.dtype)


def export_checkpoint(base_dir: Path, artefact_dir: Path, out_dir: Path) -> Path:
    """Write base + MedTPE rows + MedTPE tokenizer files to `out_dir` (atomically); returns it."""
    from transformers import AutoModelForCausalLM

    from medtpe.core.tokenizer import MedTPETokenizer

    base_dir, artefact_dir, out_dir = Path(base_dir), Path(artefact_dir), Path(out_dir)
    tokenizer = MedTPETokenizer.load(artefact_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    rows, fingerprint = load_rows(artefact_dir)
    check_fingerprint(model, fingerprint, artefact_dir)
    rows_before = model.get_input_embeddings().weight.shape[0]
    grow_vocabulary(model, tokenizer.vocab_size)
    ids = row_ids(tokenizer)
    if not set(range(rows_before, tokenizer.vocab_size)) <= set(ids):
        raise ValueError(f"{artefact_dir}: some fresh ids have no row")
    if rows.output_base and max(ids, default=-1) >= rows_before:
        raise ValueError(f"{artefact_dir}: fresh ids have no base head rows ({OUTPUT_ROWS_KEY})")
    write_rows_into(model, ids, rows)
    if rows.rope_stretch is not None:  # the rows were trained to be read stretched
        model.config.rope_parameters = stretched_rope(
            model.config.rope_parameters, model.config.max_position_embeddings, rows.rope_stretch
        )
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        _copy_tokenizer_files(artefact_dir, base_dir, tmp)
    return out_dir


def ensure_export(
    base_dir: Path, artefact_dir: Path, export_dir: Path, force: bool = False
) -> Path:
    """The exported checkpoint of this base and artefact in `export_dir`: exported now (and
    stamped with the artefact's digest) when missing, stale or `force`d, else left as it is."""
    export_dir = Path(export_dir)
    if not force and export_is_current(artefact_dir, export_dir):
        return export_dir
    logger.info("exporting %s onto %s into %s", artefact_dir, base_dir, export_dir)
    export_checkpoint(base_dir, artefact_dir, export_dir)
    (export_dir / EXPORT_STAMP).write_text(content_digest(artefact_dir) + "\n")
    return export_dir


def prepare_model_files(config: ModelConfig) -> None:
    """Write what `medtpe.inference.model.load_model(config)` reads and is missing or stale: the
    default base model, and in `medtpe` mode the export (for the offline tools)."""
    base_dir = ensure_base_model(config.model_dir)
    if config.mode == "medtpe":
        ensure_export(base_dir, config.artefact_dir, config.export_dir)


def _copy_tokenizer_files(artefact_dir: Path, base_dir: Path, out_dir: Path) -> None:
    """Copy tokenizer files to `out_dir`: the artefact's, else the base's (not tokenizer.json)."""
    if not (artefact_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{artefact_dir} holds no tokenizer.json")
    for name in TOKENIZER_FILES:
        source = artefact_dir / name
        if not source.is_file() and name != "tokenizer.json":
            source = base_dir / name
        if source.is_file():
            shutil.copyfile(source, out_dir / name)
