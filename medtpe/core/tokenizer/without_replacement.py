"""The "without replacement" variant (paper, Table 3): vocabulary extension instead of id reuse.

A replacement artefact gives its M new tokens the ids of the M cheapest base tokens, which it
evicts. Its extension twin keeps every base token and gives the same new tokens fresh ids
V, V+1, ..., V+M-1 after the base vocabulary (V ids), and its byte-fallback bytes the next ones;
the model's embedding grows to match (`medtpe.training.export`). The base tokenization is kept
whole, so a text without a token the replacement artefact evicts gets the same tokens under both, up
to the ids' names; one with such a token keeps it as one token in the twin.
"""

from __future__ import annotations

from medtpe.core.tokenizer.medtpe_tokenizer import MedTPETokenizer

VOCABULARY_SETTING = "vocabulary"
"""Settings key naming the variant (`"extension"`) of a derived twin."""
SOURCE_SETTING = "replacement_artefact_id"
"""Settings key holding the artefact id of the replacement artefact a twin was derived from."""


def fresh_ids(tok: MedTPETokenizer) -> dict[int, int]:
    """Replacement id -> extension id: new token i (in `new_tokens` order) -> V + i, then each
    byte-fallback id (in byte order) -> the next fresh id."""
    reused = [t.id for t in tok.new_tokens] + list(tok.byte_fallback.values())
    return {i: tok.base.vocab_size + k for k, i in enumerate(reused)}


def extension_twin(tok: MedTPETokenizer) -> MedTPETokenizer:
    """The extension ("without replacement") twin of replacement tokenizer `tok`: the same merge
    table and new tokens (same strings, same order) on fresh ids (`fresh_ids`), nothing evicted.
    Its artefact id differs from `tok`'s; its settings name the variant and `tok`'s artefact id.
    """
    if tok.is_extension:
        raise ValueError("this MedTPE tokenizer already is an extension artefact")
    ids = fresh_ids(tok)
    merges = [(ids.get(a, a), ids.get(b, b), ids[new]) for a, b, new in tok.merges]
    settings = tok.settings | {VOCABULARY_SETTING: "extension", SOURCE_SETTING: tok.artefact_id}
    fallback = {byte: ids[i] for byte, i in tok.byte_fallback.items()}
    return MedTPETokenizer(tok.base, merges, {}, settings, tok.corpus_stats, fallback)
