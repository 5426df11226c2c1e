"""The local signing-key file a SQLite ledger keeps when no key is configured
(`medtpe.ledger.signing.local_key`): processes starting at once on a fresh cache all end up with
one key; a write that fails (a full disk) leaves no file behind; a key file that group or others
may open, or an empty one, stops the start with one line naming the file, and is never replaced
by a new key."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import SigningKeyError, local_key, parse_private_key, signer_for
from tests.support.paths import ROOT

STARTS = 100
SEED = "bmV2ZXIgdXNlIHRoaXMgc2VlZCBmb3IgcmVhbCBrZXk="
"""A 32-byte seed (base64) written as a key file by the tests."""


def test_simultaneous_first_starts_converge_on_one_key(tmp_path: Path) -> None:
    key_file = tmp_path / "cache" / "ledger-signing-key"
    ready = threading.Barrier(STARTS)

    def start(_: int) -> str:
        ready.wait()  # every start looks for the file at the same moment
        return signer_for("sqlite:///x.sqlite3", None, key_file).key_id

    with ThreadPoolExecutor(STARTS) as pool:
        key_ids = list(pool.map(start, range(STARTS)))
    assert len(key_ids) == STARTS
    assert set(key_ids) == {signer_for("sqlite:///x.sqlite3", None, key_file).key_id}
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert [path.name for path in key_file.parent.iterdir()] == [key_file.name]  # no temporaries


def test_a_failed_write_leaves_no_key_file(tmp_path: Path) -> None:
    """A write past the file-size limit fails as one on a full disk does (EFBIG for ENOSPC)."""
    key_file = tmp_path / "ledger-signing-key"
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from medtpe.ledger.signing import SigningKeyError, local_key\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    local_key(Path(sys.argv[1]))\n"
        "except SigningKeyError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(key_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith(f"the signing key file {key_file} cannot be created (")
    assert "MEDTPE_LEDGER_SIGNING_KEY" in done.stdout
    assert list(tmp_path.iterdir()) == []  # neither the key file nor a temporary one
    made = local_key(key_file)  # the next start, with room to write, makes the key
    assert local_key(key_file).private_bytes_raw() == made.private_bytes_raw()


def test_a_key_file_group_or_others_may_open_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "ledger-signing-key"
    key_file.write_text(SEED + "\n")
    key_file.chmod(0o644)
    with pytest.raises(SigningKeyError) as refused:
        local_key(key_file)
    assert str(refused.value) == (
        f"the signing key file {key_file} is open to group or others (mode 0644): "
        f"run `chmod 600 {key_file}`"
    )
    key_file.chmod(0o600)
    assert local_key(key_file).private_bytes_raw() == parse_private_key(SEED).private_bytes_raw()


@pytest.mark.parametrize(
    ("content", "reason"),
    [("", "is empty"), ("not a key\n", "holds no key (the signing key is neither PEM nor base64)")],
)
def test_an_empty_or_corrupt_key_file_is_refused_and_kept(
    tmp_path: Path, content: str, reason: str
) -> None:
    key_file = tmp_path / "ledger-signing-key"
    key_file.write_text(content)
    key_file.chmod(0o600)
    with pytest.raises(SigningKeyError) as refused:
        local_key(key_file)
    assert str(refused.value).startswith(f"the signing key file {key_file} {reason}: restore it")
    assert key_file.read_text() == content  # never regenerated


def test_the_service_refuses_to_start_on_an_open_key_file(tmp_path: Path) -> None:
    """`medtpe serve` checks the key file with its settings: one line, no traceback."""
    key_file = tmp_path / "ledger-signing-key"
    key_file.write_text(SEED + "\n")
    key_file.chmod(0o640)
    ledger_variables = LedgerSettings.variables()
    env = {name: value for name, value in os.environ.items() if name not in ledger_variables}
    env["MEDTPE_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("medtpe")), "serve"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"run `chmod 600 {key_file}`" in done.stderr
