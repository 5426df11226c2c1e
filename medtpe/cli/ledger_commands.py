"""`medtpe ledger upgrade|public-key|checkpoint|audit` and `medtpe verify ID`: the prediction
ledger from the command line, on the ledger `MEDTPE_LEDGER_URL` names (as the service and `medtpe
predict` do) or `--ledger URL`.

`medtpe ledger checkpoint` signs the hash chain's head and prints it as one JSON line (`--out
FILE` appends it there too); `medtpe ledger audit` walks the chain, checks every row's signature
and the checkpoints, the ledger's and those of `--checkpoints FILE`, and names the first gap,
insertion, reordering or edit (exit status 1).

`medtpe verify` checks a row's signature and that the row says what its receipt signs, then
re-derives the prediction — the record from `--meds DIR` / `--fhir DIR` or the row's stored
record, the artefact's digest, the rendering, the prompt's ids, the engine's answer with the
receipt's decoding settings, in the dtype the receipt names — and names each part that
differs; its exit status is 1 when any does. The engine (vLLM, torch) is imported inside the
command only."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import os
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import click

from medtpe.cli import options
from medtpe.core.meds.canonical import parse_canonical_record
from medtpe.inference.engines.protocol import Dtype
from medtpe.ledger.receipt import Derivation, Receipt
from medtpe.ledger.settings import LedgerMissing, LedgerSettings
from medtpe.ledger.signing import SigningKeyError, public_key_from_jwk
from medtpe.ledger.verification import AUTO, P_TOLERANCE, Check, check_row, compare

if TYPE_CHECKING:  # the store (SQLAlchemy: the `service` extra) inside the commands only
    from medtpe.ledger.chain import Checkpoint
    from medtpe.ledger.store import Ledger, PredictionRow

AUDIT_DEADLINE_S = 3600.0
"""How long `medtpe ledger audit` may run by default."""
RERUN_DTYPES = tuple(name for name in get_args(Dtype) if name != AUTO)
"""What `medtpe verify --dtype` may name."""

LEDGER_OPTION = click.option(
    "--ledger",
    "ledger_url",
    type=options.LEDGER_URL,
    envvar="MEDTPE_LEDGER_URL",
    show_envvar=True,
    default=None,
    help="The ledger's database URL [default: `.cache/ledger.sqlite3`].",
)


def ledger_settings(ledger_url: str | None) -> LedgerSettings:
    """The ledger settings of the `MEDTPE_LEDGER_*` variables, `--ledger` in place of
    `MEDTPE_LEDGER_URL` where given (`LedgerSettings.from_environ`); a value they refuse stops
    the command, naming its variable. Every command opens the ledger with their `open_ledger`."""
    given = {"ledger_url": ledger_url} if ledger_url else {}
    try:
        return LedgerSettings.from_environ(**given)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def existing_ledger(settings: LedgerSettings) -> Ledger:
    """The ledger a command that reads it opens (`verify`, `outcomes`, `monitor`): one that is
    already there (`LedgerSettings.open_ledger(existing=True)`). A SQLite path of no file (a
    typo) is a usage error naming it (exit status 2), never a new, empty ledger; a ledger that
    cannot be opened an error (exit status 1)."""
    from medtpe.ledger.store import LedgerUnavailable

    try:
        return settings.open_ledger(existing=True)
    except LedgerMissing as exc:
        raise click.BadParameter(str(exc), param_hint="--ledger") from exc
    except LedgerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc


@click.group("ledger")
def ledger() -> None:
    """The prediction ledger: its schema and its signing key."""


@ledger.command("upgrade")
@LEDGER_OPTION
def upgrade(ledger_url: str | None) -> None:
    """Create the ledger's tables or migrate them to the newest schema (the service and
    `medtpe predict` do it on start, too)."""
    from medtpe.ledger.migrate import current, head
    from medtpe.ledger.store import LedgerUnavailable

    settings = ledger_settings(ledger_url)
    try:
        opened = settings.open_ledger()
    except LedgerUnavailable as exc:
        raise click.ClickException(str(exc)) from exc
    with opened.engine.connect() as connection:
        click.echo(f"ledger at schema {current(connection)} (newest: {head()})")
    opened.close()


@ledger.command("public-key")
@LEDGER_OPTION
def public_key(ledger_url: str | None) -> None:
    """Print the public key that checks the receipts' signatures, as a JWK."""
    try:
        click.echo(json.dumps(ledger_settings(ledger_url).signer().jwk()))
    except SigningKeyError as exc:
        raise click.ClickException(str(exc)) from exc


@ledger.command("checkpoint")
@LEDGER_OPTION
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also append the checkpoint's line to this file (keep it away from the ledger).",
)
def checkpoint(ledger_url: str | None, out_file: Path | None) -> None:
    """Sign the ledger's hash chain at its last row now, keep the checkpoint in the ledger and
    print it as one JSON line."""
    from medtpe.ledger.store import LedgerUnavailable

    settings = ledger_settings(ledger_url)
    opened = existing_ledger(settings)
    try:
        line = opened.checkpoint(settings.signer()).to_line()
    except (SigningKeyError, LedgerUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        opened.close()
    if out_file is not None:
        try:
            with out_file.open("a", encoding="utf-8") as kept:
                kept.write(line + "\n")
                kept.flush()
                os.fsync(kept.fileno())
        except OSError as exc:
            raise click.ClickException(
                f"{out_file}: the checkpoint cannot be kept ({exc.strerror or exc}); it is in "
                f"the ledger: {line}"
            ) from exc
    click.echo(line)


PUBLIC_KEY_OPTION = click.option(
    "--public-key",
    "public_key_file",
    type=options.INPUT_FILE,
    default=None,
    help="The signer's public key, a JWK file [default: the configured signing key's].",
)


@ledger.command("audit")
@LEDGER_OPTION
@click.option(
    "--checkpoints",
    "checkpoints_file",
    type=options.INPUT_FILE,
    default=None,
    help="Checkpoints kept away from the ledger (`medtpe ledger checkpoint --out`'s lines).",
)
@PUBLIC_KEY_OPTION
@click.option(
    "--deadline-s",
    type=click.FloatRange(min=0.0, min_open=True),
    default=AUDIT_DEADLINE_S,
    show_default=True,
    help="Stop, unfinished (exit status 1), past this many seconds.",
)
def audit(
    ledger_url: str | None,
    checkpoints_file: Path | None,
    public_key_file: Path | None,
    deadline_s: float,
) -> None:
    """Check the ledger's hash chain, every row's signature and the signed checkpoints; name the
    first row deleted, inserted, moved or edited (exit status 1)."""
    from medtpe.ledger.audit import AuditIncomplete
    from medtpe.ledger.audit import audit as audit_ledger
    from medtpe.ledger.store import LedgerUnavailable

    kept = [] if checkpoints_file is None else kept_checkpoints(checkpoints_file)
    settings = ledger_settings(ledger_url)
    opened = existing_ledger(settings)
    try:
        key = (
            _jwk_file_key(public_key_file)
            if public_key_file is not None
            else settings.signer().public_key
        )
        found = audit_ledger(opened.engine, key, kept, deadline_s=deadline_s)
    except (SigningKeyError, AuditIncomplete, LedgerUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        opened.close()
    click.echo(found.line())
    if found.finding is not None:
        raise SystemExit(1)


def kept_checkpoints(path: Path) -> list[tuple[str, Checkpoint]]:
    """The checkpoints of the file `path` (one JSON line each; blank lines skipped), named by
    the file; a line that is none is a usage error naming the file and the line."""
    from medtpe.ledger.chain import Checkpoint

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--checkpoints") from exc
    kept = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            kept.append((str(path), Checkpoint.from_line(line)))
        except ValueError as exc:
            raise click.BadParameter(
                f"{path}, line {number}: no checkpoint ({exc})", param_hint="--checkpoints"
            ) from exc
    return kept


@dataclass(frozen=True)
class RecordSource:
    """Where `medtpe verify` reads the record again: a MEDS dataset, FHIR Bulk Data export
    directories, else the row's stored record."""

    meds_dir: Path | None = None
    fhir_dirs: tuple[Path, ...] = ()
    fhir_mapping: Path | None = None


@click.command("verify")
@click.argument("prediction_id")
@LEDGER_OPTION
@options.meds_dir_option(
    "The MEDS dataset the record comes from (its subject is the row's).", required=False
)
@options.fhir_dirs_option(
    "In place of --meds: FHIR Bulk Data export directories holding the patient's resources."
)
@options.FHIR_MAPPING_OPTION
@click.option(
    "--codes",
    "codes_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A MEDS dataset whose metadata/codes.parquet describes the codes, as the answer's "
    "service or job had [default: --meds for a `medtpe predict` row, else the artefact's].",
)
@PUBLIC_KEY_OPTION
@click.option(
    "--p-tolerance",
    type=click.FloatRange(min=0.0),
    default=P_TOLERANCE,
    show_default=True,
    help="Largest |Δp(yes)| of the re-run taken as the same.",
)
@click.option(
    "--dtype",
    type=click.Choice(RERUN_DTYPES),
    default=None,
    help="The re-run's dtype for a receipt that says `auto` (written before receipts named the "
    "dtype that ran) [default: auto, as this machine resolves it]; a receipt naming its dtype "
    "is re-run in it.",
)
@click.option(
    "--signature-only", is_flag=True, help="Check the signature and the row only (no engine)."
)
@options.MODEL_FILES_OPTIONS
def verify(
    prediction_id: str,
    ledger_url: str | None,
    meds_dir: Path | None,
    fhir_dirs: tuple[Path, ...],
    fhir_mapping: Path | None,
    codes_dir: Path | None,
    public_key_file: Path | None,
    p_tolerance: float,
    dtype: str | None,
    signature_only: bool,
    model_dir: Path | None,
    artefact_dir: Path | None,
    export_dir: Path | None,
) -> None:
    """Check the ledger row PREDICTION_ID's signature and re-derive its answer."""
    from medtpe.ledger.store import LedgerUnavailable

    if meds_dir is not None and fhir_dirs:
        raise click.UsageError("give --meds or --fhir, not both")
    settings = ledger_settings(ledger_url)
    opened = existing_ledger(settings)
    try:
        key = (
            _jwk_file_key(public_key_file)
            if public_key_file is not None
            else settings.signer().public_key
        )
        row = opened.get(prediction_id)
        linked = opened.chain_link_holds(prediction_id)
    except (SigningKeyError, LedgerUnavailable, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        opened.close()
    if row is None:
        raise click.ClickException(f"no prediction {prediction_id} in the ledger")
    receipt, checks = check_row(row, key)
    checks.append(chain_check(linked))
    if receipt is not None and not signature_only:
        source = RecordSource(meds_dir, fhir_dirs, fhir_mapping)
        if meds_dir is None and not fhir_dirs and row.record is None:
            raise click.UsageError(
                "the row keeps no record (MEDTPE_LEDGER_RECORDS=digest): give --meds or --fhir"
            )
        if codes_dir is None and row.door == "batch_meds":
            codes_dir = meds_dir
        files = options.model_files(model_dir, artefact_dir, export_dir)
        rerun = rerun_dtype(receipt.dtype, dtype)
        again = rederive(row, receipt, source, files | {"codes_dir": codes_dir}, dtype=rerun)
        checks += compare(receipt, again, p_tolerance)
    click.echo(report(checks))
    if not all(check.ok for check in checks):
        raise SystemExit(1)


def chain_check(linked: bool | None) -> Check:
    """The row's place in the hash chain as a verify line: every column as chained, the
    unsigned ones included (`Ledger.chain_link_holds`; None: not checkable here)."""
    if linked is None:
        return Check(
            "chain",
            True,
            "not checked here (no place, or the row before it gone): "
            "medtpe ledger audit walks the chain",
        )
    return Check(
        "chain",
        linked,
        "every column as chained, after the row before it"
        if linked
        else "row edited: a column differs from the chain's digest of it (medtpe ledger audit)",
    )


def _jwk_file_key(path: Path) -> Any:
    """The public key of the JWK file `path`; a file holding none is a usage error naming
    `--public-key`."""
    try:
        return public_key_from_jwk(json.loads(path.read_text()))
    except (ValueError, AttributeError) as exc:  # a SigningKeyError; AttributeError: no object
        raise click.BadParameter(f"{path}: {exc}", param_hint="--public-key") from exc


def rerun_dtype(signed: str, given: str | None) -> str:
    """The dtype `medtpe verify` re-runs in: the receipt's; for a receipt that says `auto`,
    `--dtype` where given (else `auto`, resolved on this machine)."""
    if given is None or given == signed:
        return signed
    if signed != AUTO:
        raise click.UsageError(
            f"the receipt names its dtype ({signed}): it is re-run in it; --dtype is for "
            "receipts that say auto"
        )
    return given


EngineStart = Callable[[Any], Any]


def rederive(
    row: PredictionRow,
    receipt: Receipt,
    source: RecordSource,
    model_files: dict[str, Any],
    start_engine: EngineStart | None = None,
    run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run,
    *,
    dtype: str | None = None,
) -> Derivation:
    """Re-derive the prediction of `row`: the model configured as the receipt says (mode,
    budget, windowing, dtype unless `dtype` is given, answer length) on an eager engine (no
    torch.compile), the record read from `source`, prepared and answered with the receipt's
    decoding settings (`start_engine`: vLLM unless given; `run`: the event loop's runner, one
    loop for every row where one engine serves several); what the answer derives from as the
    doors hash it (`medtpe.ledger.answers.ReceiptBasis.of`), its `dtype` the one the engine ran
    in."""
    from medtpe.core.fhir import load_site_mapping
    from medtpe.core.meds.readers import MedsDataset
    from medtpe.core.prompt.layout import LEGACY_LAYOUT, PromptLayout
    from medtpe.core.tasks import get_task
    from medtpe.inference.engines.factories import start_vllm
    from medtpe.inference.model import ModelConfig, load_model
    from medtpe.inference.receipt_facts import answer_facts
    from medtpe.inference.record import FhirResources, MedsRecord
    from medtpe.inference.sampling import Sampling
    from medtpe.ledger.answers import ReceiptBasis
    from medtpe.training.export import prepare_model_files

    rendering = receipt.rendering
    config = ModelConfig.from_options(
        **model_files,
        mode=receipt.mode,
        max_input_tokens=rendering["max_input_tokens"],
        window_policy=rendering["window_policy"],
        window_grid_hours=rendering["window_grid_hours"],
        max_new_tokens=receipt.decoding["max_new_tokens"],
        dtype=dtype or receipt.dtype,
        # one answer to re-derive: torch.compile's warm-up (about 2 minutes on a CPU, more than
        # the engine's other start-up) would not pay back; eager gives the same p(yes)
        enforce_eager=True,
    )
    prepare_model_files(config)
    loaded = load_model(config)
    task = get_task(receipt.task)
    layout = PromptLayout(rendering.get("prompt_layout", LEGACY_LAYOUT))
    predictor = loaded.predictor.with_layout(layout, rendering.get("shell_tokens"))
    loaded = dataclasses.replace(loaded, predictor=predictor)
    when = None if row.prediction_time is None else row.prediction_time.replace(tzinfo=None)
    stored: dict[str, str] | None = None
    """A stored record's own descriptions (no FHIR mapping runs to give them)."""
    if source.meds_dir is not None:
        events = MedsDataset.load(source.meds_dir).events(int(row.subject_id))
        prepared = MedsRecord(events, when).prepare(predictor, task)
    elif source.fhir_dirs:
        resources = list(patient_resources(source.fhir_dirs, row.subject_id))
        mapping = load_site_mapping(source.fhir_mapping)
        prepared = FhirResources(resources, mapping, when, row.subject_id).prepare(predictor, task)
    else:
        assert row.record is not None
        events, stored_when, stored = parse_canonical_record(row.record)
        prepared = predictor.prepare(task, events, stored_when, stored or None)
    if row.shadow_of is not None:  # a fidelity shadow answered the uncompressed prompt
        prepared = predictor.uncompressed(prepared)
    engine = (start_engine or start_vllm)(loaded.engine_config)
    try:
        sampling = Sampling(**receipt.decoding)
        start = time.perf_counter()
        answer = run(predictor.answer(engine, prepared, sampling))
        facts = answer_facts(
            loaded, engine, prepared, sampling, answer, time.perf_counter() - start
        )
    finally:
        engine.shutdown()
    if stored is not None:
        facts = dataclasses.replace(facts, descriptions=stored)
    return ReceiptBasis.of(facts)


def patient_resources(directories: tuple[Path, ...], patient_id: str) -> Iterator[Any]:
    """The resources of an export's NDJSON files (`.ndjson`, `.ndjson.gz`) that name
    `Patient/<id>` or are that Patient: only those lines are parsed and kept."""
    reference = f'"Patient/{patient_id}"'
    own_id = f'"id":"{patient_id}"'
    for directory in directories:
        for path in sorted([*directory.glob("*.ndjson"), *directory.glob("*.ndjson.gz")]):
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8") as lines:
                for line in lines:
                    compact = line.replace(" ", "")
                    if reference in compact or (
                        '"resourceType":"Patient"' in compact and own_id in compact
                    ):
                        yield json.loads(line)


def report(checks: list[Check]) -> str:
    """The checks as the command prints them, one a line."""
    return "\n".join(f"{'ok  ' if c.ok else 'DIFF'} {c.part:<9} {c.detail}" for c in checks)


commands = [ledger, verify]
