"""`medtpe build-tokenizer` and `medtpe tokenize` end to end."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.core import MedTPETokenizer
from tests.support.tokenizer_support import icu_records, smollm2_dir


def test_build_then_tokenize(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in icu_records(20)))
    out = tmp_path / "artefact"
    runner = CliRunner()
    args = [
        "build-tokenizer",
        "--base",
        str(smollm2_dir()),
        "--corpus",
        str(corpus),
        "--budget",
        "100",
        "--max-n",
        "3",
        "--out",
        str(out),
    ]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "100 new tokens" in result.output and "compression" in result.output
    tok = MedTPETokenizer.load(out)
    assert len(tok.new_tokens) == 100
    # the chat template's tokens stay in the vocabulary
    template = (smollm2_dir() / "chat_template.jinja").read_text()
    assert not set(tok.base_encode(template)) & set(tok.evicted)

    result = runner.invoke(
        cli, ["tokenize", "--tokenizer", str(out), "[2180-03-01 10:00] Heart Rate"]
    )
    assert result.exit_code == 0, result.output
    assert "base (" in result.output and "MedTPE (" in result.output and "*" in result.output
