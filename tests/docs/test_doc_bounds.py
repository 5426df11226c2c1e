"""The pages a newcomer reads first stay within their bounds, so each stays what it is for and
the detail goes where it belongs:

- README.md, the product page (what it does, the two commands, the first request, the headline
  figures with what they show and do not, the limits, links): at most 10,240 bytes; the glossary
  and longer explanations live in docs/.
- docs/benchmarks.md, the current figures, each with its command, machine, date and records: at
  most 800 lines; superseded runs and their detail go to the logs in docs/research/.
- tests/README.md, the rules for writing and running tests (where a test goes, how to mark it,
  how the documents are checked): at most 8,192 bytes. The rules take about 6.4 KB; the bound
  leaves room for a few more rules and none for a timing journal (the one it held was 8.7 KB on
  its own): how long runs take and why belongs in docs/research/test-suite-log.md.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from tests.support.paths import ROOT


class Bound(NamedTuple):
    path: str
    unit: str  # "bytes" or "lines"
    limit: int
    where_detail_goes: str


BOUNDS = [
    Bound("README.md", "bytes", 10_240, "docs/ (an existing page, or docs/glossary.md)"),
    Bound("docs/benchmarks.md", "lines", 800, "a log in docs/research/ (superseded runs, detail)"),
    Bound("tests/README.md", "bytes", 8_192, "docs/research/test-suite-log.md (timings, history)"),
]


def size(path: str, unit: str) -> int:
    """The size of a repository file in bytes or in lines."""
    data = (ROOT / path).read_bytes()
    return len(data) if unit == "bytes" else len(data.splitlines())


@pytest.mark.parametrize("bound", BOUNDS, ids=[b.path for b in BOUNDS])
def test_the_page_stays_within_its_bound(bound: Bound) -> None:
    measured = size(bound.path, bound.unit)
    assert measured <= bound.limit, (
        f"{bound.path} is {measured:,} {bound.unit}, over its bound of {bound.limit:,}: "
        f"move detail to {bound.where_detail_goes}"
    )
