"""Token-level distillation (`medtpe.training.token_distillation`) on a tiny Llama with the real
SmolLM2 tokenizer: the forward stops at the layer matched, only the new rows train and the held-out
loss falls, a re-run resumes (teacher cache and checkpoint), the KL over every aligned position
adds to the loss and trains, the `base` output side keeps the base head's rows, its export
unties the head (the same checkpoint whether the rows file holds those rows or marks them as the
base head's), and a student read with a RoPE stretch learns against the plain teacher."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from medtpe.core.tokenizer import MedTPETokenizer  # noqa: E402
from medtpe.core.tokenizer.build import build_tokenizer  # noqa: E402
from medtpe.core.tokenizer.snippets import cut  # noqa: E402
from medtpe.training.distill_config import DistillConfig, long_stage, matched_layers  # noqa: E402
from medtpe.training.embedding_init import NewRows, init_new_rows, with_output_rows  # noqa: E402
from medtpe.training.export import (  # noqa: E402
    BASE_OUTPUT,
    EMBEDDINGS_FILE,
    OUTPUT_ROWS_KEY,
    export_checkpoint,
    load_rows,
    model_fingerprint,
    save_rows,
    write_rows_into,
)
from medtpe.training.rope_stretch import stretch_rope  # noqa: E402
from medtpe.training.token_distillation import (  # noqa: E402
    CHECKPOINT_FILE,
    distill,
    hidden_at,
    next_token_kl,
)
from tests.support.model_fixtures import tiny_llama, tiny_llama_model  # noqa: E402

LINES = [
    f"{t} Heart Rate [bpm] {80 + i}; Arterial Blood Pressure systolic [mmHg] {110 + i}; "
    f"Respiratory Rate [insp/min] {14 + i % 5}; O2 saturation pulseoxymetry [%] {95 + i % 4}"
    for i, t in enumerate(["08:00", "09:00", "10:00", "11:00", "12:00", "13:00"] * 8)
]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="module")
def tokenizer(base_dir: Path) -> MedTPETokenizer:
    return build_tokenizer(base_dir / "tokenizer.json", LINES, budget=16, progress=False)


def _snippets(tok: MedTPETokenizer, lines: list[str]) -> list:
    return [s for line in lines for s in cut(tok, tok.base_encode(line), 12)]


def test_matched_layers() -> None:
    assert matched_layers(None, 30) == (6, 12, 18, 24, -1)
    assert matched_layers(None, 2) == (1, -1)
    assert matched_layers((2, -1), 2) == (2, -1)
    with pytest.raises(ValueError, match="2 layers"):
        matched_layers((3,), 2)


def test_long_stage_settings() -> None:
    assert long_stage(DistillConfig()) is None
    long = long_stage(DistillConfig(long_tokens=3072, long_snippets=40, long_val_snippets=6))
    assert (long.snippet_tokens, long.snippets, long.val_snippets) == (3072, 40, 6)
    assert (long.batch_size, long.epochs, long.eval_every, long.long_tokens) == (1, 1, 10, None)
    with pytest.raises(ValueError, match="long_tokens"):
        DistillConfig(snippet_tokens=64, long_tokens=64)
    with pytest.raises(ValueError, match="long_windows"):
        DistillConfig(long_windows="first")


def test_forward_stops_at_the_layer_matched() -> None:
    model = tiny_llama_model()
    ids = torch.tensor([[5, 17, 300, 4000, 12]])
    full = model.model(input_ids=ids, output_hidden_states=True)
    first, last = hidden_at(model, [1, -1], input_ids=ids)
    torch.testing.assert_close(first, full.hidden_states[1])
    torch.testing.assert_close(last, full.last_hidden_state)
    calls = []
    handle = model.model.layers[1].register_forward_hook(lambda *_: calls.append(1))
    (only,) = hidden_at(model, [1], input_ids=ids)
    handle.remove()
    assert calls == [] and torch.equal(only, first)  # the second layer never ran


@pytest.mark.parametrize("output", ["base", "tied"])
def test_distillation_trains_only_the_new_rows_and_resumes(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path, output: str
) -> None:
    train, val = _snippets(tokenizer, LINES[:36]), _snippets(tokenizer, LINES[36:])
    assert sum(len(s.pairs) for s in train) > 100
    config = DistillConfig(lr=3e-2, batch_size=8, epochs=2, eval_every=2, output=output)
    run = tmp_path / "run"
    result = distill(base_dir, tokenizer, train, val, run, config, device="cpu")
    assert result.best_val_loss < result.initial_val_loss
    assert result.steps == 2 * -(-len(train) // 8)
    assert len(list(run.glob("train-teacher-*.pt"))) == 1 and (run / CHECKPOINT_FILE).is_file()
    model = tiny_llama_model()
    mean = init_new_rows(model, tokenizer.new_tokens)
    assert not torch.allclose(result.rows.input, mean.input)
    ids = [t.id for t in tokenizer.new_tokens]
    assert result.rows.output is None and result.rows.output_base == (output == "base")
    if output == "base":  # the reused ids keep the base head's rows, read from the base model
        resolved = with_output_rows(result.rows, model, ids)
        assert torch.equal(resolved.output, model.lm_head.weight[ids].detach())
    again = distill(base_dir, tokenizer, train, val, run, config, device="cpu")
    assert again.steps == result.steps and again.seconds["train"] < 1.0  # resumed: nothing left
    torch.testing.assert_close(again.rows.input, result.rows.input)


def test_a_stretched_student_learns_against_the_plain_teacher(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path
) -> None:
    train, val = _snippets(tokenizer, LINES[:12]), _snippets(tokenizer, LINES[36:])
    plain = DistillConfig(lr=3e-2, batch_size=8, epochs=1, eval_every=2)
    runs = {}
    for name, config in (("plain", plain), ("stretched", replace(plain, rope_stretch=2.0))):
        runs[name] = distill(base_dir, tokenizer, train, val, tmp_path / name, config, device="cpu")
    # one teacher (plain RoPE, the same cache file), a student that reads otherwise
    teachers = [sorted(p.name for p in (tmp_path / n).glob("*-teacher-*.pt")) for n in runs]
    assert teachers[0] == teachers[1]
    assert runs["stretched"].initial_val_loss != pytest.approx(runs["plain"].initial_val_loss)
    assert runs["stretched"].best_val_loss < runs["stretched"].initial_val_loss
    with pytest.raises(ValueError, match="rope_stretch"):
        DistillConfig(rope_stretch=1.0)
    assert (runs["plain"].rows.rope_stretch, runs["stretched"].rows.rope_stretch) == (None, 2.0)


def test_the_dense_kl_reads_every_aligned_position_and_trains(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path
) -> None:
    train, val = _snippets(tokenizer, LINES[:12]), _snippets(tokenizer, LINES[36:])
    plain = DistillConfig(lr=3e-2, batch_size=8, epochs=1, eval_every=2)
    dense = replace(plain, dense_kl_weight=50.0)
    runs = {}
    for name, config in (("plain", plain), ("dense", dense)):
        runs[name] = distill(base_dir, tokenizer, train, val, tmp_path / name, config, device="cpu")
    # the same start, a loss that adds the KL over every aligned position of the held-out snippets
    assert runs["dense"].initial_val_loss > runs["plain"].initial_val_loss
    assert runs["dense"].best_val_loss < runs["dense"].initial_val_loss
    cached = torch.load(next((tmp_path / "dense").glob("train-teacher-*.pt")))
    assert cached["final"].dtype == torch.float32
    width = tiny_llama_model().config.hidden_size
    assert cached["final"].shape == (sum(len(s.pairs) for s in train), width)
    assert torch.load(next((tmp_path / "plain").glob("train-teacher-*.pt")))["final"] is None
    model = tiny_llama_model()
    states = torch.randn(5, model.config.hidden_size)
    assert next_token_kl(model, states, states).item() == pytest.approx(0.0, abs=1e-6)
    assert next_token_kl(model, states, states.flip(0)).item() > 0
    with pytest.raises(ValueError, match="dense_kl_weight"):
        DistillConfig(dense_kl_weight=1.0, layers=(1,))


@pytest.mark.parametrize("stretch", [None, 1.88])
def test_the_export_serves_the_rows_at_the_stretch_they_were_trained_at(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path, stretch: float | None
) -> None:
    """The rows file keeps the stretch; the export's config.json carries it (stock vLLM and
    transformers read it there), and the exported model reads as the base model with the rows
    written and RoPE stretched in place (`medtpe.training.rope_stretch`, what distillation
    trained)."""
    artefact = tmp_path / "artefact"
    tokenizer.save(artefact)
    model = tiny_llama_model()
    rows = replace(init_new_rows(model, tokenizer.new_tokens), rope_stretch=stretch)
    save_rows(artefact, rows, model_fingerprint(model))
    assert load_rows(artefact)[0].rope_stretch == stretch
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        export_checkpoint(base_dir, artefact, tmp_path / "export")
    )
    rope = exported.config.rope_parameters["rope_type"]
    assert rope == ("default" if stretch is None else "yarn")
    write_rows_into(model, [t.id for t in tokenizer.new_tokens], rows)
    stretch_rope(model, stretch)
    ids = torch.tensor([[t.id for t in tokenizer.new_tokens] * 40])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, model(ids).logits)
    frequencies = exported.model.rotary_emb.inv_freq
    torch.testing.assert_close(frequencies, model.model.rotary_emb.inv_freq)
    stretch_rope(model, None)  # the stretch is what tells them apart from a plain reading
    assert torch.equal(frequencies, model.model.rotary_emb.inv_freq) == (stretch is None)


def test_export_of_base_output_rows_unties_the_head(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path
) -> None:
    artefact = tmp_path / "artefact"
    tokenizer.save(artefact)
    model = tiny_llama_model()
    ids = [t.id for t in tokenizer.new_tokens]
    trained = init_new_rows(model, tokenizer.new_tokens).input * 3
    base_head = model.lm_head.weight[ids].detach().clone()
    rows = type(init_new_rows(model, tokenizer.new_tokens))(trained, base_head)
    save_rows(artefact, rows, model_fingerprint(model))
    out = export_checkpoint(base_dir, artefact, tmp_path / "export")
    exported = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert exported.config.tie_word_embeddings is False
    embed, head = exported.get_input_embeddings().weight, exported.get_output_embeddings().weight
    torch.testing.assert_close(embed[ids], trained)
    torch.testing.assert_close(head[ids], base_head)
    others = [i for i in range(100) if i not in ids]
    torch.testing.assert_close(head[others], model.lm_head.weight[others])


@pytest.mark.parametrize("tie", [True, False])
def test_base_output_rows_marked_not_stored_export_the_same_checkpoint(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path, tie: bool
) -> None:
    """A rows file whose output side is marked as the base head's (`output_rows: base`, no
    `new_rows_output`) exports byte for byte the checkpoint of one holding those rows."""
    base = base_dir if tie else tiny_llama(tmp_path / "untied-base", tie=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    ids = [t.id for t in tokenizer.new_tokens]
    trained = init_new_rows(model, tokenizer.new_tokens).input * 3
    marked = NewRows(trained, rope_stretch=1.5, output_base=True)
    explicit = with_output_rows(marked, model, ids)
    assert torch.equal(explicit.output, model.get_output_embeddings().weight[ids].detach())
    exports = {}
    for name, rows in (("marked", marked), ("explicit", explicit)):
        artefact = tmp_path / name
        tokenizer.save(artefact)
        save_rows(artefact, rows, model_fingerprint(model))
        exports[name] = export_checkpoint(base, artefact, tmp_path / f"{name}-export")
    with safe_open(str(tmp_path / "marked" / EMBEDDINGS_FILE), framework="pt") as handle:
        assert list(handle.keys()) == ["new_rows"]
        assert handle.metadata()[OUTPUT_ROWS_KEY] == BASE_OUTPUT
    loaded = load_rows(tmp_path / "marked")[0]
    assert loaded.output_base and loaded.output is None and torch.equal(loaded.input, trained)
    for name in ("model.safetensors", "config.json"):
        marked_bytes = (exports["marked"] / name).read_bytes()
        assert marked_bytes == (exports["explicit"] / name).read_bytes(), name
    exported = transformers.AutoModelForCausalLM.from_pretrained(exports["marked"])
    assert exported.config.tie_word_embeddings is False
    assert torch.equal(exported.get_input_embeddings().weight[ids], trained)
    assert torch.equal(exported.get_output_embeddings().weight[ids], explicit.output)
