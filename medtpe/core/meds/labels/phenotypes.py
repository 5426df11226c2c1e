"""The 25 acute-care phenotypes of the MIMIC-III benchmark as HCUP CCS groups of ICD-9 and
ICD-10 codes (`data/phenotype_codes.csv`; sources and licences in `data/README.md`)."""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable
from pathlib import Path

PHENOTYPE_CODES_FILE = Path(__file__).resolve().parent / "data" / "phenotype_codes.csv"


@functools.cache
def phenotype_map() -> dict[tuple[str, str], frozenset[str]]:
    """{(ICD version, code without dot): the phenotypes it belongs to}."""
    found: dict[tuple[str, str], set[str]] = {}
    with PHENOTYPE_CODES_FILE.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            found.setdefault((row["icd_version"], row["code"]), set()).add(row["phenotype"])
    return {key: frozenset(value) for key, value in found.items()}


def phenotypes_of(codes: Iterable[tuple[str, str]], order: Iterable[str]) -> list[str]:
    """The phenotypes that (ICD version, code) pairs belong to, in the order of `order`."""
    mapping = phenotype_map()
    found = set().union(*(mapping.get(code, frozenset()) for code in codes))
    return [name for name in order if name in found]
