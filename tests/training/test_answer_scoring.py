"""`medtpe.training.answer_scoring.RowsModel` on a tiny Llama: gapped position ids (a MedTPE prompt
read at its tokens' original positions) still read one causal sequence, and a RoPE stretch of the
slow dimensions changes only those and is undone exactly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from medtpe.training.answer_scoring import RowsModel  # noqa: E402
from tests.support.model_fixtures import tiny_llama  # noqa: E402

IDS = [101, 2024, 877, 3141, 59, 600, 1234, 42]
GAPPED = [0, 2, 3, 5, 7, 8, 9, 11]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> RowsModel:
    return RowsModel(tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def test_gapped_positions_read_the_whole_prompt(model: RowsModel) -> None:
    # Position ids that skip are the original positions of a shorter prompt, not the boundaries
    # of packed sequences: the last position still attends to the first token.
    first = model.score(IDS, GAPPED).hidden[-1]
    changed = model.score([7, *IDS[1:]], GAPPED).hidden[-1]
    assert not torch.allclose(torch.from_numpy(first), torch.from_numpy(changed))
    plain = model.score(IDS).hidden
    assert torch.allclose(
        torch.from_numpy(model.score(IDS, list(range(len(IDS)))).hidden), torch.from_numpy(plain)
    )


def test_rope_stretch_scales_the_slow_dimensions_only(model: RowsModel) -> None:
    rotary = model.model.model.rotary_emb
    plain_freq = rotary.inv_freq.clone()
    plain = model.score(IDS).top_logprobs
    model.set_rope_stretch(2.0)
    ratio = rotary.inv_freq / plain_freq
    assert ratio[0] == pytest.approx(1.0)  # the fastest pair: local order as trained
    assert ratio[-1] == pytest.approx(2.0)  # the slowest: positions twice as far apart
    assert torch.all(ratio[1:] >= ratio[:-1])
    assert model.score(IDS).top_logprobs != plain
    model.set_rope_stretch(None)
    assert torch.equal(rotary.inv_freq, plain_freq)
    assert model.score(IDS).top_logprobs == plain
