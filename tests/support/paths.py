"""Where the tests find the repository, their fixtures and the optional shared data."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared"
DEFAULT_ARTEFACT_ID = "5e6ed2d8381e"
"""The committed default artefact's id (`artefacts/smollm2-135m-icu`): the tests that pin it
read it here, so a rebuilt default is re-pinned in one place."""
