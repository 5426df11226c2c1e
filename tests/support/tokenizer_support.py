"""Shared tokenizer-test material: the default model's tokenizer (committed fixture), a small
byte-level BPE trained here, a synthetic ICU-style corpus, MedTPE builds on them, and text
strategies (hypothesis) for round-trip properties."""

from __future__ import annotations

import gzip
import os
import random
from collections.abc import Callable
from functools import cache
from pathlib import Path

from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from medtpe.core.tokenizer import BaseTokenizer, MedTPETokenizer
from medtpe.core.tokenizer.base import bytes_to_unicode
from medtpe.core.tokenizer.build import build_tokenizer
from medtpe.core.tokenizer.without_replacement import extension_twin
from tests.support.paths import FIXTURES, ROOT

TOKENIZER_FIXTURES = FIXTURES / "tokenizers"
PROTECTED_TEXT = "<|im_start|>system\nYou are a clinical assistant.<|im_end|>\nAnswer in JSON."
ENGLISH = (
    "The quick brown fox jumps over the lazy dog. Please summarise the patient's history and "
    "answer whether the patient will die during this ICU stay. Respond with a JSON object "
    'such as {"answer": "yes"}; do not add any other text. Economic growth slowed in the '
    "third quarter, while inflation remained above the central bank's target."
)
_ITEMS = [
    ("Heart Rate", "bpm", 60, 130),
    ("Arterial Blood Pressure systolic", "mmHg", 80, 170),
    ("Arterial Blood Pressure diastolic", "mmHg", 40, 100),
    ("Respiratory Rate", "insp/min", 8, 35),
    ("O2 saturation pulseoxymetry", "%", 85, 100),
    ("Glucose (Blood)", "mg/dL", 70, 300),
    ("Potassium (Blood)", "mEq/L", 3, 6),
    ("Creatinine (Blood)", "mg/dL", 0.4, 4.0),
    ("Temperature Fahrenheit", "°F", 96, 103),
    ("Hemoglobin (Blood)", "g/dL", 7, 16),
]
_TEXT_EVENTS = [
    "Admission to MEDICAL INTENSIVE CARE UNIT",
    "Heparin started",
    "Diagnosis: Unspecified essential hypertension",
    "Normal saline 0.9% infusion",
]


def icu_records(n: int, seed: int = 0, lines: int = 120) -> list[str]:
    """Synthetic records in the rendered-prompt style: one timestamped event per line."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        day, minute = rng.randint(1, 28), rng.randint(0, 600)
        out = [f"Patient age: {rng.randint(20, 90)} years", "Events (oldest first):"]
        for _ in range(lines):
            minute += rng.randint(0, 30)
            stamp = f"2180-03-{day:02d} {minute // 60 % 24:02d}:{minute % 60:02d}"
            if rng.random() < 0.15:
                out.append(f"[{stamp}] {rng.choice(_TEXT_EVENTS)}")
            else:
                name, unit, lo, hi = rng.choice(_ITEMS)
                out.append(f"[{stamp}] {name}: {round(rng.uniform(lo, hi), 1)} {unit}")
        records.append("\n".join(out))
    return records


@cache
def smollm2_dir() -> Path:
    """A model-like directory holding SmolLM2's tokenizer.json (unpacked from the fixture)."""
    out = ROOT / ".cache" / "test-fixtures" / "smollm2-tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    data = gzip.decompress((TOKENIZER_FIXTURES / "smollm2" / "tokenizer.json.gz").read_bytes())
    target = out / "tokenizer.json"
    if not target.is_file() or target.read_bytes() != data:
        replace_file(target, data)
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    replace_file(out / "chat_template.jinja", template.encode())
    return out


def replace_file(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: concurrent test processes share these cache files."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_bytes(data)
    os.replace(scratch, path)


@cache
def small_tokenizer_file(missing: tuple[int, ...] = ()) -> Path:
    """A byte-level BPE (vocabulary 700) trained here on fixture text, with two special tokens;
    its alphabet lacks the bytes `missing` (none: every byte has a token)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    absent = {bytes_to_unicode()[b] for b in missing}
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=[c for c in pre_tokenizers.ByteLevel.alphabet() if c not in absent],
        show_progress=False,
    )
    tok.train_from_iterator(icu_records(30, seed=7) + [ENGLISH] * 5, trainer=trainer)
    name = "small-bpe" + "".join(f"-{b:02x}" for b in missing)
    out = ROOT / ".cache" / "test-fixtures" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_file(out, tok.to_str(pretty=True).encode())
    return out


@cache
def smollm2_medtpe(method: str = "static", max_n: int = 2) -> MedTPETokenizer:
    """MedTPE on SmolLM2's tokenizer, mined from synthetic ICU records."""
    base = BaseTokenizer.load(smollm2_dir())
    return build_tokenizer(
        base, icu_records(40), 300, max_n, method, [PROTECTED_TEXT], progress=False
    )


@cache
def smollm2_extension(method: str = "static", max_n: int = 2) -> MedTPETokenizer:
    """The extension ("without replacement") twin of `smollm2_medtpe(method, max_n)`."""
    return extension_twin(smollm2_medtpe(method, max_n))


@cache
def small_medtpe(
    method: str = "bpe", max_n: int = 3, missing: tuple[int, ...] = ()
) -> MedTPETokenizer:
    """MedTPE on the small trained tokenizer (lacking the bytes `missing`)."""
    base = BaseTokenizer.load(small_tokenizer_file(missing))
    return build_tokenizer(
        base, icu_records(40), 60, max_n, method, [PROTECTED_TEXT], progress=False
    )


@cache
def small_extension(method: str = "bpe", max_n: int = 3) -> MedTPETokenizer:
    """The extension twin of `small_medtpe(method, max_n)` (no byte fallback)."""
    return extension_twin(small_medtpe(method, max_n))


REPLACEMENT_BUILDS: dict[str, Callable[[], MedTPETokenizer]] = {
    "smollm2-static": lambda: smollm2_medtpe("static", 2),
    "smollm2-bpe3": lambda: smollm2_medtpe("bpe", 3),
    "small-bpe3": lambda: small_medtpe("bpe", 3),
    "small-static3": lambda: small_medtpe("static", 3),
}
"""The replacement builds the tokenizer invariants are checked on, by name (built on first use)."""


EDGE_CASES = [
    "",
    " ",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|><|endoftext|>",
    "a<|im_end",
    "😀👩‍⚕️ 中文病历 テスト",
    "\x00\x01\x02\t\r\n\x7f\u200b\ufeff",
    "1" * 500,
    "2180-03-23 11:51:00 " * 30,
    "   leading and trailing   ",
    "\n\n\n[2180-01-01 00:00] Heart Rate: 87.0 bpm\n",
    "\ud7ff\ue000\U0010ffff",
    # bytes SmolLM2's vocabulary lacks (its own tokenizer drops them): byte fallback
    "\x04\x06\x13\x14\x16\x1d",
    "a\x04b. \x13x\x1d\x1d<|im_end|>\x06",
    "\U00040000\U00050000z\U000bffff\U000c0000 \U0003ffff",
    "<|im_start|>\x14user\n\U00080001<|im_end|>",
]

# SmolLM2's vocabulary has no token for bytes 0x04 0x06 0x13 0x14 0x16 0x1D nor for 0xF1 0xF2
# (lead bytes of U+40000..U+BFFFF): its own tokenizer drops them, MedTPE spells them with its
# byte-fallback ids. Every string round-trips exactly.
FALLBACK_CHARS = "\x04\x06\x13\x14\x16\x1d\U00040000\U0007ffff\U00080000\U000bffff"
ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=200)
# dense in the characters that need the fallback, next to text they could merge with
DENSE_TEXT = st.lists(
    st.one_of(
        st.sampled_from(FALLBACK_CHARS),
        st.characters(min_codepoint=0x40000, max_codepoint=0xBFFFF),
        st.sampled_from([" ", "\n", "a", ".", "1", "<|im_end|>", "Heart Rate", "é", "中"]),
        st.characters(codec="utf-8"),
    ),
    max_size=40,
).map("".join)
MIXED_TEXT = st.lists(
    st.one_of(
        ANY_TEXT,
        DENSE_TEXT,
        st.sampled_from(EDGE_CASES),
        st.sampled_from(icu_records(18, seed=5, lines=20)),
    ),
    max_size=4,
).map("".join)
