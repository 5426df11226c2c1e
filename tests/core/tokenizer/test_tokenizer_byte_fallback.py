"""Byte fallback: the bytes SmolLM2's vocabulary lacks get evicted ids, so MedTPE is lossless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from medtpe.cli.main import cli
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.core.tokenizer.base import UTF8_BYTES, BaseTokenizer, bytes_to_unicode
from medtpe.core.tokenizer.build import add_byte_fallback
from medtpe.core.tokenizer.replacement import MergeGraph, single_char_ids
from tests.support.paths import SHARED
from tests.support.tokenizer_support import (
    PROTECTED_TEXT,
    icu_records,
    small_medtpe,
    smollm2_medtpe,
)

SMOLLM2_MISSING = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2]
QWEN = SHARED / "tokenizers" / "qwen2.5" / "tokenizer.json"


def _old_style(tok: MedTPETokenizer) -> MedTPETokenizer:
    """`tok` as a build from before byte fallback: same merges and new-token evictions only."""
    graph = MergeGraph(tok.base)
    new_ids = {t.id for t in tok.new_tokens}
    evicted = {i: graph.decompose(i, new_ids) for i in sorted(new_ids)}
    return MedTPETokenizer(tok.base, tok.merges, evicted, tok.settings, tok.corpus_stats)


def test_missing_bytes_of_smollm2() -> None:
    base = smollm2_medtpe("static", 2).base
    vocab = base.tokenizer.get_vocab(with_added_tokens=False)
    absent = [b for b, c in bytes_to_unicode().items() if c not in vocab]
    # 21 byte symbols absent; 13 of them (0xC0 0xC1 0xF5..0xFF) never occur in UTF-8
    assert len(absent) == 21
    assert sorted(set(absent) - UTF8_BYTES) == [0xC0, 0xC1, *range(0xF5, 0x100)]
    assert base.missing_bytes() == SMOLLM2_MISSING
    assert base.decode(base.encode("a\x04\x1db")) == "ab"  # what the base does with them


@pytest.mark.skipif(not QWEN.is_file(), reason="Qwen2.5 tokenizer not in ../shared")
def test_qwen_has_every_byte() -> None:
    assert BaseTokenizer.load(QWEN).missing_bytes() == []


def test_complete_byte_vocabularies_get_no_fallback() -> None:
    tok = small_medtpe("bpe", 3)
    assert tok.base.missing_bytes() == [] and tok.byte_fallback == {}
    assert set(tok.evicted) == {t.id for t in tok.new_tokens}


@pytest.mark.parametrize("method,max_n", [("static", 2), ("bpe", 3)])
def test_fallback_ids(method: str, max_n: int) -> None:
    tok = smollm2_medtpe(method, max_n)
    assert list(tok.byte_fallback) == SMOLLM2_MISSING
    ids = tok.fallback_ids
    assert len(ids) == len(SMOLLM2_MISSING)
    assert not ids & {t.id for t in tok.new_tokens}
    assert ids <= tok.evicted.keys()
    graph = MergeGraph(tok.base)
    protected = graph.ancestry({i for t in tok.new_tokens for i in t.constituents})
    protected |= tok.base.special_ids | single_char_ids(tok.base)
    protected |= set(tok.base_encode(PROTECTED_TEXT, special_tokens=True))
    protected |= set(tok.base_encode(PROTECTED_TEXT))
    assert not ids & protected
    # the new tokens keep the ids a build without byte fallback gives them (the M cheapest)
    assert {t.id for t in tok.new_tokens} < set(tok.evicted)
    # never produced from base ids; each spells its byte
    assert not ids & set(tok.encode_ids(list(range(tok.base.vocab_size))))
    for byte, i in tok.byte_fallback.items():
        if byte < 0x80:
            assert tok.encode(chr(byte)) == [i] and tok.decode([i]) == chr(byte)


def test_encode_decode_with_fallback() -> None:
    tok = smollm2_medtpe("static", 2)
    text = "Heart Rate\x04: 87\x1d\x1d bpm \U00050000."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "plain", text]) == [ids, tok.encode("plain"), ids]
    assert tok.tokens([tok.byte_fallback[4]]) == ["\x04"]
    with pytest.raises(ValueError, match="no base-tokenizer equivalent"):
        tok.to_base_ids(ids)
    dropped = tok.to_base_ids(ids, drop_fallback=True)
    assert tok.base.decode(dropped) == tok.base.decode(tok.base_encode(text))
    # fast path: text needing no fallback is the base ids, decomposed and merged
    plain = "Heart Rate: 87 bpm"
    assert not tok.needs_fallback(plain) and tok.needs_fallback(text)
    assert tok.encode(plain) == tok.encode_ids(tok.base_encode(plain))


def test_artefact_keeps_fallback_and_vocabulary_size(tmp_path: Path) -> None:
    tok = smollm2_medtpe("bpe", 3)
    tok.save(tmp_path)
    doc = json.loads((tmp_path / "medtpe.json").read_text())
    assert doc["byte_fallback"] == {str(b): i for b, i in tok.byte_fallback.items()}
    loaded = MedTPETokenizer.load(tmp_path)
    assert loaded.byte_fallback == tok.byte_fallback
    assert loaded.artefact_id == tok.artefact_id
    detok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert detok.get_vocab_size(with_added_tokens=True) == tok.base.vocab_size
    symbol = bytes_to_unicode()
    for byte, i in tok.byte_fallback.items():
        assert detok.id_to_token(i) == symbol[byte]
    text = "x\x13\x14y \U000a0000\x16"
    assert detok.decode(loaded.encode(text), skip_special_tokens=False) == text


def test_old_artefact_loads_and_behaves_as_before(tmp_path: Path) -> None:
    old = _old_style(smollm2_medtpe("static", 2))
    old.save(tmp_path)
    doc = json.loads((tmp_path / "medtpe.json").read_text())
    del doc["byte_fallback"]  # written by builds from before byte fallback
    (tmp_path / "medtpe.json").write_text(json.dumps(doc))
    loaded = MedTPETokenizer.load(tmp_path)
    assert loaded.byte_fallback == {} and loaded.artefact_id == old.artefact_id
    text = "a\x04b\U00050000c " + icu_records(1)[0]
    assert loaded.encode(text) == loaded.encode_ids(loaded.base_encode(text))
    assert loaded.decode(loaded.encode(text)) == loaded.base.decode(loaded.base_encode(text))


def test_add_byte_fallback_to_an_old_artefact() -> None:
    built = smollm2_medtpe("static", 2)
    old = _old_style(built)
    # with the build's corpus, the same evictions as a fresh build
    same = add_byte_fallback(old, icu_records(40), [PROTECTED_TEXT])
    assert same.byte_fallback == built.byte_fallback and same.evicted == built.evicted
    assert same.artefact_id == built.artefact_id
    # without a corpus: the latest base merges, new tokens and their ids unchanged
    added = add_byte_fallback(old, protected_texts=[PROTECTED_TEXT])
    assert added.new_tokens == old.new_tokens and added.merges == old.merges
    assert list(added.byte_fallback) == SMOLLM2_MISSING
    assert not added.fallback_ids & old.evicted.keys()
    for i, parts in added.evicted.items():  # every decomposition avoids every evicted id
        assert not set(parts) & added.evicted.keys()
        assert "".join(map(added.base.id_to_token, parts)) == added.base.id_to_token(i)
    text = "a\x04b\U00050000c\x1d " + icu_records(1)[0]
    assert added.decode(added.encode(text)) == text
    assert add_byte_fallback(added) is added
    assert add_byte_fallback(small_medtpe("bpe", 3)) is small_medtpe("bpe", 3)


def test_add_byte_fallback_cli(tmp_path: Path) -> None:
    """The command's wiring, on a small base lacking SmolLM2's missing bytes (what it adds is
    checked on SmolLM2 itself above): saving and loading SmolLM2's artefacts took seconds."""
    old_dir, out = tmp_path / "old", tmp_path / "new"
    old = _old_style(small_medtpe("static", 2, tuple(SMOLLM2_MISSING)))
    assert old.base.missing_bytes() == SMOLLM2_MISSING and old.byte_fallback == {}
    old.save(old_dir)
    (old_dir / "embeddings.safetensors").write_bytes(b"rows")
    result = CliRunner().invoke(
        cli, ["add-byte-fallback", "--tokenizer", str(old_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "0x04->" in result.output
    assert (out / "embeddings.safetensors").read_bytes() == b"rows"
    tok = MedTPETokenizer.load(out)
    assert tok.new_tokens == old.new_tokens
    assert list(tok.byte_fallback) == SMOLLM2_MISSING
    assert tok.decode(tok.encode("\x04\x06")) == "\x04\x06"
