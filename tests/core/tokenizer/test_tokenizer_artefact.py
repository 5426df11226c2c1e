"""Artefact save/load, the base mismatch error, the build's corpus statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from medtpe.core import MedTPETokenizer
from medtpe.core.tokenizer import BaseTokenizer
from medtpe.core.tokenizer.artefact_files import ArtefactMismatchError
from medtpe.core.tokenizer.mining import NgramCounter, select_static
from tests.support.tokenizer_support import (
    icu_records,
    small_medtpe,
    small_tokenizer_file,
    smollm2_dir,
    smollm2_medtpe,
)


def test_save_load_round_trip(tmp_path: Path) -> None:
    tok = smollm2_medtpe("bpe", 3)
    tok.save(tmp_path)
    loaded = MedTPETokenizer.load(tmp_path)
    assert loaded.artefact_id == tok.artefact_id
    assert loaded.fingerprint == tok.fingerprint == BaseTokenizer.load(smollm2_dir()).fingerprint
    assert loaded.new_tokens == tok.new_tokens
    assert loaded.evicted == tok.evicted
    texts = icu_records(3, seed=9)
    assert loaded.encode_batch(texts) == tok.encode_batch(texts)
    doc = json.loads((tmp_path / "medtpe.json").read_text())
    assert doc["settings"]["method"] == "bpe" and doc["corpus_stats"]["n_tokens"] > 0
    assert (tmp_path / "chat_template.jinja").is_file()  # copied from the model directory


def test_load_with_explicit_base(tmp_path: Path) -> None:
    tok = smollm2_medtpe("static", 2)
    tok.save(tmp_path)
    loaded = MedTPETokenizer.load(tmp_path, base=smollm2_dir())
    assert loaded.encode("Heart Rate: 87 bpm") == tok.encode("Heart Rate: 87 bpm")


def test_mismatched_base_is_a_clear_error(tmp_path: Path) -> None:
    smollm2_medtpe("static", 2).save(tmp_path)
    with pytest.raises(ArtefactMismatchError, match="built on base tokenizer"):
        MedTPETokenizer.load(tmp_path, base=small_tokenizer_file())


def test_tampered_detokenizer_is_detected(tmp_path: Path) -> None:
    small_medtpe("bpe", 3).save(tmp_path)
    detok = json.loads((tmp_path / "tokenizer.json").read_text())
    detok["model"]["merges"] = detok["model"]["merges"][:-1]
    (tmp_path / "tokenizer.json").write_text(json.dumps(detok))
    with pytest.raises(ArtefactMismatchError):
        MedTPETokenizer.load(tmp_path)


def test_save_keeps_other_files(tmp_path: Path) -> None:
    (tmp_path / "embeddings.safetensors").write_bytes(b"rows")
    small_medtpe("bpe", 3).save(tmp_path)
    small_medtpe("bpe", 3).save(tmp_path)
    assert (tmp_path / "embeddings.safetensors").read_bytes() == b"rows"


def test_ngram_counter_matches_a_plain_count() -> None:
    records = [[1, 2, 3, 1, 2], [2, 3], [1, 2, 1, 2, 3]]
    counter = NgramCounter(vocab_size=10, max_n=3)
    counter.add(records[:2])
    counter.add(records[2:])
    counts = counter.result()
    expected: dict[tuple[int, ...], int] = {}
    for r in records:
        for n in (2, 3):
            for k in range(len(r) - n + 1):
                expected[tuple(r[k : k + n])] = expected.get(tuple(r[k : k + n]), 0) + 1
    got = {
        counts.unpack(key, n): c
        for n, (keys, cnts) in counts.ngrams.items()
        for key, c in zip(keys.tolist(), cnts.tolist(), strict=True)
    }
    assert got == expected
    assert counts.n_tokens == 12 and counts.unigrams.tolist()[:4] == [0, 4, 5, 3]


def test_static_selection_lowers_extensions_of_chosen_tokens() -> None:
    counter = NgramCounter(vocab_size=10, max_n=3)
    counter.add([[1, 2, 3]] * 10 + [[1, 2]] * 10 + [[4, 5]] * 13)
    counts = counter.result()
    # scores: (1,2) 40, (1,2,3) 30, (4,5) 26, (2,3) 20; choosing (1,2) lowers (1,2,3) to 10
    chosen = select_static(counts, 3, lambda g: "".join(map(str, g)))
    assert chosen == [(1, 2), (4, 5), (2, 3)]
    assert np.all(counts.unigrams[1:6] == [20, 20, 10, 13, 13])


def test_a_tokenizer_is_parsed_once_per_content_and_place(tmp_path: Path) -> None:
    tok = small_medtpe("bpe", 2)
    tok.save(tmp_path / "a")
    tok.save(tmp_path / "b")
    first, again = MedTPETokenizer.load(tmp_path / "a"), MedTPETokenizer.load(tmp_path / "b")
    assert first.base.tokenizer is again.base.tokenizer  # rebuilt from the detokenizer once
    assert first.base is not again.base and first.base.model_dir is None  # no model files
    file = small_tokenizer_file()
    assert BaseTokenizer.load(file).tokenizer is BaseTokenizer.load(file).tokenizer
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(file.read_bytes())
    in_dir, plain = BaseTokenizer.load(copy.parent), BaseTokenizer.load(copy)
    assert (in_dir.model_dir, in_dir.path, plain.model_dir) == (copy.parent, copy, None)
    assert in_dir.encode("<|im_end|> x") == plain.encode("<|im_end|> x")
    assert in_dir._plain is plain._plain  # derived once, shared by the copies
    changed = json.loads(copy.read_text())
    changed["model"]["merges"] = changed["model"]["merges"][:-1]
    copy.write_text(json.dumps(changed))
    reread = BaseTokenizer.load(copy)  # another content
    assert len(reread.json_obj["model"]["merges"]) == len(changed["model"]["merges"])
    assert reread.fingerprint != BaseTokenizer.load(file).fingerprint
