"""Training layer on a tiny Llama (SmolLM2's family: tied embeddings) with the real SmolLM2
tokenizer and a MedTPE tokenizer built in the test: initialisation, embedding split, SSFT
(only the new rows change), checkpoint/resume, export and reload, the extension twin's export,
rows whose output side is the base head's."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from medtpe.cli.main import cli  # noqa: E402
from medtpe.core.tokenizer import MedTPETokenizer  # noqa: E402
from medtpe.core.tokenizer.build import build_tokenizer  # noqa: E402
from medtpe.core.tokenizer.without_replacement import extension_twin  # noqa: E402
from medtpe.training import ssft as ssft_module  # noqa: E402
from medtpe.training.embedding_init import (  # noqa: E402
    DEFAULT_ALPHA,
    NewRows,
    init_new_rows,
    mean_row_norm,
)
from medtpe.training.embedding_split import apply_split, split_rows  # noqa: E402
from medtpe.training.examples import Example, collate  # noqa: E402
from medtpe.training.export import (  # noqa: E402
    load_rows,
    model_fingerprint,
    save_rows,
    write_rows_into,
)
from medtpe.training.losses import DensePositions, final_hidden, teacher_hidden  # noqa: E402
from medtpe.training.ssft import SSFTConfig, train_ssft  # noqa: E402
from medtpe.training.ssft_pipeline import run_ssft, split_by_subject  # noqa: E402
from medtpe.training.without_replacement import write_extension_artefact  # noqa: E402
from tests.support.model_fixtures import tiny_llama, tiny_llama_model  # noqa: E402

CORPUS = [
    f"{t} Heart Rate [bpm] {80 + i}; Arterial Blood Pressure systolic [mmHg] {110 + i}; "
    f"Respiratory Rate [insp/min] {14 + i % 5}; O2 saturation pulseoxymetry [%] {95 + i % 4}"
    for i, t in enumerate(["08:00", "09:00", "10:00", "11:00", "12:00", "13:00"] * 8)
]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied Llama checkpoint with the SmolLM2 tokenizer."""
    return tiny_llama(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="module")
def tokenizer(base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> MedTPETokenizer:
    """A MedTPE tokenizer (16 new tokens) mined from clinical-style lines, saved as an artefact."""
    tok = build_tokenizer(base_dir / "tokenizer.json", CORPUS, budget=16, progress=False)
    assert len(tok.new_tokens) == 16
    return tok


def _examples(tok: MedTPETokenizer, lines: list[str]) -> list[Example]:
    """Examples whose answer is the next line's first base tokens (stands in for pseudo-labels)."""
    examples = []
    for line, answer in itertools.pairwise(lines):
        teacher = tok.base_encode(line)
        examples.append(Example(tok.encode(line), teacher, tok.base_encode(answer)[:6]))
    return examples


def _config(**overrides: object) -> SSFTConfig:
    settings = {"lr": 1e-2, "max_steps": 4, "eval_every": 2, "device": "cpu"} | overrides
    return SSFTConfig(**settings)


def test_init_rows_are_rescaled_constituent_means(tokenizer: MedTPETokenizer) -> None:
    model = tiny_llama_model(tie=True)
    rows = init_new_rows(model, tokenizer.new_tokens)
    weight = model.get_input_embeddings().weight.detach()
    target = DEFAULT_ALPHA * mean_row_norm(weight)
    assert rows.output is None
    torch.testing.assert_close(rows.input.norm(dim=1), target.expand(len(rows.input)))
    for row, token in zip(rows.input, tokenizer.new_tokens, strict=True):
        mean = weight[list(token.constituents)].mean(dim=0)
        assert torch.nn.functional.cosine_similarity(row, mean, dim=0) > 0.9999


def test_untied_model_gets_input_and_output_rows(tokenizer: MedTPETokenizer) -> None:
    model = tiny_llama_model(tie=False)
    rows = init_new_rows(model, tokenizer.new_tokens)
    assert rows.output is not None
    head = model.get_output_embeddings().weight.detach()
    torch.testing.assert_close(
        rows.output.norm(dim=1), (DEFAULT_ALPHA * mean_row_norm(head)).expand(len(rows.output))
    )
    params = apply_split(model, [t.id for t in tokenizer.new_tokens], rows)
    assert [p.shape for p in params] == [rows.input.shape, rows.output.shape]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        "model.embed_tokens.new_rows",
        "lm_head.new_rows",
    ]


@pytest.mark.parametrize("tie", [True, False])
def test_last_init_reads_the_last_constituent_and_keeps_the_base_head(
    tokenizer: MedTPETokenizer, tie: bool
) -> None:
    model = tiny_llama_model(tie=tie)
    rows = init_new_rows(model, tokenizer.new_tokens, method="last")
    weight = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    ids = [t.id for t in tokenizer.new_tokens]
    torch.testing.assert_close(
        rows.input, weight[[t.constituents[-1] for t in tokenizer.new_tokens]]
    )
    assert rows.output is not None  # a tied model's export unties the head for these ids
    torch.testing.assert_close(rows.output, head[ids])
    before = weight.clone(), head.clone()
    rows.input.add_(1.0)  # the rows are copies: the model's own matrices stay as they were
    rows.output.add_(1.0)
    torch.testing.assert_close((weight, head), before)
    with pytest.raises(ValueError, match="init method"):
        init_new_rows(model, tokenizer.new_tokens, method="median")


@pytest.mark.parametrize("tie", [True, False])
def test_split_model_equals_model_with_rows_written(tokenizer: MedTPETokenizer, tie: bool) -> None:
    ids = [t.id for t in tokenizer.new_tokens]
    split = tiny_llama_model(tie)
    rows = init_new_rows(split, tokenizer.new_tokens)
    rows.input += 0.01 * torch.randn_like(rows.input)  # rows that differ from the init
    apply_split(split, ids, rows)
    full = tiny_llama_model(tie)
    write_rows_into(full, ids, rows)
    input_ids = torch.tensor([tokenizer.encode(CORPUS[0]) + ids[:4]])
    torch.testing.assert_close(split(input_ids).logits, full(input_ids).logits)


@pytest.mark.parametrize("loss", ["ce", "kl", "kl_dense"])
def test_a_run_keeps_the_rows_best_by_its_own_loss(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path, loss: str
) -> None:
    """Every validation measures both losses; the kept rows are those with the lowest held-out
    value of the loss the run trains (a KL run is not judged by CE to the greedy answers)."""
    examples = _examples(tokenizer, CORPUS[:14])
    config = _config(loss=loss, max_steps=4, eval_every=1)
    result = train_ssft(base_dir, tokenizer, examples[:10], examples[10:], tmp_path / loss, config)
    validations = [row for row in result.history if row["val_loss"] != ""]
    assert len(validations) == 4  # step 0 and after each of the 3 steps (10 examples / 4)
    for row in validations:
        assert row["val_loss"] == row[f"val_{loss}"]
        assert row["val_kl_dense"] > row["val_kl"] > 0  # kl plus the prompt's shared ends
    best = min(validations, key=lambda row: row["val_loss"])
    assert result.best_val_loss == best["val_loss"] == result.best_val[loss]
    assert result.best_val == {name: best[f"val_{name}"] for name in ("ce", "kl", "kl_dense")}
    if loss == "kl_dense":
        assert result.best_val_loss < result.initial_val_loss


def test_dense_positions_pair_the_same_text(base_dir: Path, tokenizer: MedTPETokenizer) -> None:
    """kl_dense's pairs point at the same text on both sides of a padded batch; before the first
    MedTPE token the two models read the same ids, so their hidden states there are equal."""
    batch = _examples(tokenizer, CORPUS[:4])
    batch[1] = Example(batch[1].student[:9], tokenizer.to_base_ids(batch[1].student[:9]), [5])
    s_ids, s_mask, _ = collate(batch, "student")
    t_ids, t_mask, _ = collate(batch, "teacher")
    s_at, t_at = DensePositions(tokenizer, n=6)(batch, s_ids.shape[1], t_ids.shape[1])
    model, _ = ssft_module.load_split_model(base_dir, tokenizer, torch.device("cpu"))
    with torch.no_grad():
        student = final_hidden(model, s_mask, input_ids=s_ids).flatten(0, 1)
        teacher = teacher_hidden(model, t_ids, t_mask).flatten(0, 1)
    new_ids = {t.id for t in tokenizer.new_tokens}
    rows, unmerged = [], 0
    for s, t in zip(s_at.tolist(), t_at.tolist(), strict=True):
        (row, i), (t_row, j) = divmod(s, s_ids.shape[1]), divmod(t, t_ids.shape[1])
        example = batch[row]
        assert t_row == row and i < len(example.student) - 1  # never the answer position
        assert tokenizer.decode(example.student[: i + 1]) == tokenizer.base.decode(
            example.teacher[: j + 1]
        )
        if not new_ids & set(example.student[: i + 1]):
            torch.testing.assert_close(student[s], teacher[t])
            unmerged += 1
        rows.append(row)
    assert unmerged >= 3 and sorted(set(rows)) == [0, 1, 2] and max(map(rows.count, set(rows))) == 6


def test_ssft_changes_only_new_rows_and_export_round_trips(
    base_dir: Path, tokenizer: MedTPETokenizer, tmp_path: Path
) -> None:
    examples = _examples(tokenizer, CORPUS[:14])
    result = train_ssft(
        base_dir, tokenizer, examples[:10], examples[10:], tmp_path / "run", _config()
    )
    assert result.steps == 3  # 10 examples / (2 × 2) per step
    assert [row["step"] for row in result.history] == [0, 1, 2, 3]
    assert result.best_val_loss < result.initial_val_loss

    artefact = tmp_path / "artefact"
    tokenizer.save(artefact)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    save_rows(artefact, result.rows, model_fingerprint(base))
    rows, fingerprint = load_rows(artefact)
    torch.testing.assert_close(rows.input, result.rows.input, rtol=0, atol=0)
    assert fingerprint == model_fingerprint(base)

    out = CliRunner().invoke(
        cli,
        [
            "export",
            "--base",
            str(base_dir),
            "--medtpe",
            str(artefact),
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert out.exit_code == 0, out.output
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "x")
    new_ids = torch.tensor([t.id for t in tokenizer.new_tokens])
    base_state, exported_state = base.state_dict(), exported.state_dict()
    assert base_state.keys() == exported_state.keys()
    for name, tensor in base_state.items():
        other = exported_state[name]
        if name == "model.embed_tokens.weight" or name == "lm_head.weight":
            keep = torch.ones(len(tensor), dtype=torch.bool)
            keep[new_ids] = False
            assert torch.equal(other[keep], tensor[keep]), name
            torch.testing.assert_close(other[new_ids], result.rows.input, rtol=0, atol=0)
            assert not torch.equal(other[new_ids], tensor[new_ids])
        else:
            assert torch.equal(other, tensor), name
    assert (tmp_path / "x" / "medtpe.json").is_file()
    assert MedTPETokenizer.load(tmp_path / "x").artefact_id == tokenizer.artefact_id


def test_only_new_rows_receive_gradients(base_dir: Path, tokenizer: MedTPETokenizer) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = init_new_rows(model, tokenizer.new_tokens)
    params = apply_split(model, [t.id for t in tokenizer.new_tokens], rows)
    ids = torch.tensor([tokenizer.encode(CORPUS[0])])
    model(ids).logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    for name, tensor in model.state_dict().items():
        if name in frozen:
            assert torch.equal(tensor, frozen[name]), name
    assert split_rows(model).input.shape == rows.input.shape


def test_ssft_resume_continues_an_interrupted_run(
    base_dir: Path,
    tokenizer: MedTPETokenizer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    examples = _examples(tokenizer, CORPUS[:20])
    train, val = examples[:16], examples[16:]
    straight = train_ssft(base_dir, tokenizer, train, val, tmp_path / "a", _config(loss="kl"))

    real_batch_loss, calls = ssft_module.batch_loss, []

    def crash_in_step_three(*args: object, **kwargs: object) -> object:
        calls.append(args[2])
        if calls.count("kl") == 5:  # steps 1-2 done and checkpointed, step 3 starts
            raise KeyboardInterrupt
        return real_batch_loss(*args, **kwargs)

    monkeypatch.setattr(ssft_module, "batch_loss", crash_in_step_three)
    with pytest.raises(KeyboardInterrupt):
        train_ssft(base_dir, tokenizer, train, val, tmp_path / "b", _config(loss="kl"))
    monkeypatch.setattr(ssft_module, "batch_loss", real_batch_loss)
    resumed = train_ssft(base_dir, tokenizer, train, val, tmp_path / "b", _config(loss="kl"))

    assert resumed.steps == straight.steps == 4
    torch.testing.assert_close(resumed.rows.input, straight.rows.input, rtol=0, atol=0)
    assert resumed.history == straight.history


def test_split_by_subject_keeps_each_patient_on_one_side() -> None:
    records = [{"subject_id": s, "prompt": f"p{i}"} for i, s in enumerate([1, 1, 2, 3, 3, 3, 4, 5])]
    train, val = split_by_subject(records, 0.4, seed=1)
    assert len(train) + len(val) == len(records)
    assert {r["subject_id"] for r in train}.isdisjoint({r["subject_id"] for r in val})
    assert len({r["subject_id"] for r in val}) == 2  # 40 % of 5 patients
    assert split_by_subject(records, 0.4, seed=1) == (train, val)


@pytest.mark.parametrize("tie", [True, False])
def test_extension_twin_export(
    tokenizer: MedTPETokenizer, tmp_path: Path, tie: bool, base_dir: Path
) -> None:
    """`medtpe extend-vocab` then `medtpe export`: V + M + fallback rows, the base rows bit for
    bit, the replacement artefact's rows at the fresh ids, a tokenizer.json that decodes them."""
    if not tie:
        untied = tmp_path / "untied-base"
        untied.mkdir()
        shutil.copyfile(base_dir / "tokenizer.json", untied / "tokenizer.json")
        tiny_llama_model(tie=False).save_pretrained(untied)
        base_dir = untied
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    rows = init_new_rows(base, tokenizer.new_tokens)
    rows.input += 0.01 * torch.randn_like(rows.input)  # stands in for trained rows
    source = tmp_path / "artefact"
    tokenizer.save(source)
    save_rows(source, rows, model_fingerprint(base))

    runner = CliRunner()
    twin_dir, out = tmp_path / "twin", tmp_path / "x"
    args = ["--tokenizer", str(source), "--out", str(twin_dir), "--base", str(base_dir)]
    result = runner.invoke(cli, ["extend-vocab", *args])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        cli, ["export", "--base", str(base_dir), "--medtpe", str(twin_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output

    twin = MedTPETokenizer.load(twin_dir)
    vocab, m, n_fallback = 49152, len(tokenizer.new_tokens), len(tokenizer.byte_fallback)
    assert n_fallback == 8 and twin.vocab_size == vocab + m + n_fallback
    fallback_ids = list(tokenizer.byte_fallback.values())
    exported = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert exported.config.vocab_size == twin.vocab_size
    matrices = {"model.embed_tokens.weight": (rows.input, base.get_input_embeddings().weight)}
    if not tie:
        head = base.get_output_embeddings().weight
        matrices["lm_head.weight"] = (rows.output, head)
    else:
        assert exported.get_output_embeddings().weight is exported.get_input_embeddings().weight
    state = exported.state_dict()
    for name, (new_rows, base_weight) in matrices.items():
        weight = state[name]
        assert weight.shape == (twin.vocab_size, 16)
        assert torch.equal(weight[:vocab], base_weight.detach()), name
        torch.testing.assert_close(weight[vocab : vocab + m], new_rows, rtol=0, atol=0)
        fallback_rows = base_weight.detach()[fallback_ids]  # as in the replacement checkpoint
        torch.testing.assert_close(weight[vocab + m :], fallback_rows, rtol=0, atol=0)
    for name, tensor in base.state_dict().items():
        if name not in matrices and name != "lm_head.weight":
            assert torch.equal(state[name], tensor), name
    ids = torch.tensor([twin.encode(CORPUS[0] + "\x04")])
    assert ids.max() >= vocab
    assert exported(ids).logits.shape[-1] == twin.vocab_size

    hf = transformers.AutoTokenizer.from_pretrained(out)
    for token, replaced in zip(twin.new_tokens, tokenizer.new_tokens, strict=True):
        assert hf.convert_ids_to_tokens(token.id) == token.string == replaced.string
        assert hf.decode([token.id]) == tokenizer.decode([replaced.id])
    text = CORPUS[1] + " a\x04b"
    assert hf.decode(twin.encode(text)) == text


def test_ssft_of_an_extension_artefact_is_refused(
    tokenizer: MedTPETokenizer, base_dir: Path, tmp_path: Path
) -> None:
    twin = extension_twin(tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    rows = init_new_rows(model, twin.new_tokens)  # the rows of the replacement tokens
    torch.testing.assert_close(rows.input, init_new_rows(model, tokenizer.new_tokens).input)
    with pytest.raises(ValueError, match="extension"):
        apply_split(model, [t.id for t in twin.new_tokens], rows)
    twin.save(tmp_path / "twin")
    with pytest.raises(ValueError, match="not supported"):
        run_ssft(base_dir, tmp_path / "twin", ["a"], ["b"], tmp_path / "run", _config())


def test_weights_dtype_is_bfloat16_only_on_a_bf16_cuda_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert ssft_module.weights_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert ssft_module.weights_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert ssft_module.weights_dtype(torch.device("cuda")) == torch.float32


@pytest.mark.parametrize("tie", [True, False])
def test_bfloat16_weights_train_float32_rows(
    base_dir: Path, tokenizer: MedTPETokenizer, monkeypatch: pytest.MonkeyPatch, tie: bool
) -> None:
    """The CUDA recipe on the CPU: frozen weights in bfloat16 under bfloat16 autocast, the new
    rows float32 parameters initialised from the float32 weights, and they learn."""
    if not tie:
        untied = base_dir.parent / "untied-bf16"
        untied.mkdir(exist_ok=True)
        shutil.copyfile(base_dir / "tokenizer.json", untied / "tokenizer.json")
        tiny_llama_model(tie=False).save_pretrained(untied)
        base_dir = untied
    monkeypatch.setattr(ssft_module, "weights_dtype", lambda device: torch.bfloat16)
    cpu = torch.device("cpu")
    model, params = ssft_module.load_split_model(base_dir, tokenizer, cpu)
    float32 = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    expected = init_new_rows(float32, tokenizer.new_tokens)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert [p.dtype for p in params] == [torch.float32] * (1 if tie else 2)
    torch.testing.assert_close(params[0].detach(), expected.input, rtol=0, atol=0)
    examples = _examples(tokenizer, CORPUS[:6])
    keep = torch.ones(model.config.vocab_size, dtype=torch.bool)
    before = ssft_module.validation_losses(model, examples, 2, keep, cpu)
    optimizer = torch.optim.AdamW(params, lr=5e-2)
    for _ in range(5):
        loss, _ = ssft_module.batch_loss(model, examples, "ce", keep, cpu)
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
        optimizer.step()
        optimizer.zero_grad()
    after = ssft_module.validation_losses(model, examples, 2, keep, cpu)
    assert after["ce"] < before["ce"] and set(after) == {"ce", "kl"}


def test_rows_marked_as_the_base_heads_get_it_where_held_rows_are_needed(
    tokenizer: MedTPETokenizer, base_dir: Path, tmp_path: Path
) -> None:
    """Rows whose output side is the base head's (`output_rows: base`, not stored): SSFT of an
    untied model starts its output rows there, a tied model refuses them as it refuses held
    output rows, and the extension twin (fresh ids: no base rows of their own) stores them."""
    untied_dir = tiny_llama(tmp_path / "untied-base", tie=False)
    untied = transformers.AutoModelForCausalLM.from_pretrained(untied_dir)
    ids = [t.id for t in tokenizer.new_tokens]
    head = untied.get_output_embeddings().weight.detach()[ids]
    marked = NewRows(init_new_rows(untied, tokenizer.new_tokens).input, output_base=True)
    model, params = ssft_module.load_split_model(untied_dir, tokenizer, torch.device("cpu"), marked)
    assert len(params) == 2 and torch.equal(split_rows(model).output, head)
    with pytest.raises(ValueError, match="one set of rows"):
        ssft_module.load_split_model(base_dir, tokenizer, torch.device("cpu"), marked)
    source, twin_dir = tmp_path / "artefact", tmp_path / "twin"
    tokenizer.save(source)
    save_rows(source, marked, model_fingerprint(untied))
    write_extension_artefact(source, twin_dir, untied_dir)
    twin_rows = load_rows(twin_dir)[0]
    fallback = untied.get_output_embeddings().weight.detach()[
        list(tokenizer.byte_fallback.values())
    ]
    assert not twin_rows.output_base and torch.equal(twin_rows.output, torch.cat([head, fallback]))
