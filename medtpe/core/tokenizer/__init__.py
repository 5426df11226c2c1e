"""The MedTPE tokenizer: the base BPE, then evicted-token decomposition, then token-pair merging;
how its vocabulary is mined and built; the artefact files it reads and writes.

    from medtpe.core.tokenizer import MedTPETokenizer

    tokenizer = MedTPETokenizer.load("artefacts/smollm2-135m-icu")
    ids = tokenizer.encode("Heart Rate: 80 bpm")
    assert tokenizer.decode(ids) == "Heart Rate: 80 bpm"

Modules: `medtpe_tokenizer` (`MedTPETokenizer`), `base` (the unmodified base tokenizer),
`encoding` (id rewriting after the base BPE), `mining` / `corpus` / `sharded_mining` /
`ray_mining` (n-gram counting over a MEDS dataset, shard by shard, in processes or on Ray),
`replacement` (which base tokens give up their ids), `build` (`medtpe build-tokenizer`),
`without_replacement` (the paper's vocabulary-extension ablation), `artefact_files`
(`medtpe.json` and the detokenizer `tokenizer.json`), `artefact_manifest` (an artefact
directory's manifest: digest, validated budgets), `snippets` (prompt snippets cut where both
tokenizers agree, for token-level distillation).
"""

from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle
from medtpe.core.tokenizer.base import BaseTokenizer
from medtpe.core.tokenizer.medtpe_tokenizer import MedTPETokenizer

__all__ = [
    "ArtefactBundle",
    "BaseTokenizer",
    "MedTPETokenizer",
    "artefact_files",
    "artefact_manifest",
    "base",
    "build",
    "corpus",
    "medtpe_tokenizer",
    "snippets",
    "without_replacement",
]
