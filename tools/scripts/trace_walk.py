"""The walk of three requests through the layers of `medtpe`, door to ledger row, traced on the
instant engine with `sys.setprofile` (docs/architecture.md, "Three requests, door to ledger row").

Paths: `predict` (`POST /predict` with MEDS events, the app in-process: tests/support/
service_support.py), `hook` (a CDS hook call with its prefetch: tests/support/cds_support.py) and
`fhir` (`medtpe predict --fhir` on an export of one patient: tests/batch/test_fhir_job.py). Each
is traced from its door (the first function of `medtpe` the request enters) until the call that
commits its ledger row (`Ledger.record`) returns.

A stay is one call of a function of `medtpe`; a hop is a stay entered from a stay of another
module: a call, a generator resumed by another module (each resume of a generator another
module drives is a call back into its module), or work handed to a thread (the submitting stay
is the caller). A coroutine resumed by the event loop is the same stay, not a hop. A return is a
stay left for its caller's module (a generator's yield included). A climb is a hop into a layer
its caller's layer may not import (`ALLOWED` of tests/test_layering.py) or that is on the
caller's stack below another layer (a layer climb), or into a module outside `medtpe.core`
already on the caller's stack below another module (a module climb): a layer or module left and
entered again other than by returning. The walk lists the hops on the stacks of the three
targets (the prompt's `Predictor.prepare` or `prepare_all`, the engine's `generate`,
`Ledger.record`) in the order they were made; `--all` lists every hop of the trace.

Runs on this checkout's module names (`medtpe.*`) and on the older layout's top-level packages
(`service`, `batch`, `inference`, `ledger`, `medtpe_core`, `medtpe_cli`), each mapped to its layer:

    .venv/bin/python -m tools.scripts.trace_walk [--paths predict hook fhir] [--all]

On an older checkout (its `tests` and packages first on the path, a cache of its own):

    git worktree add /tmp/before 0f20f11 && cd /tmp/before && PYTHONPATH=/tmp/before \\
        MEDTPE_CACHE_DIR=/tmp/before-cache /work/main/.venv/bin/python \\
        /work/main/tools/scripts/trace_walk.py
"""

from __future__ import annotations

import argparse
import contextvars
import dis
import importlib
import importlib.util
import inspect
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from tests.support.paths import ROOT


def _allowed() -> dict[str, set[str]]:
    """`ALLOWED` of this checkout's tests/test_layering.py (read by path: on an older tree the
    `tests` package is that tree's)."""
    path = Path(__file__).resolve().parents[2] / "tests" / "test_layering.py"
    spec = importlib.util.spec_from_file_location("layering_contract", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALLOWED


ALLOWED = _allowed()
NEW_LAYOUT = (ROOT / "medtpe").is_dir()
"""Whether the tree the tests come from has the one import root (else the older layout)."""
OLD_LAYERS = {"medtpe_core": "core", "medtpe_cli": "cli"}
"""Top-level packages of the older layout whose layer has another name (the rest: their own)."""
TARGETS = ("Predictor.prepare", "Predictor.prepare_all", "generate", "Ledger.record")
"""The functions whose stacks make the walk (the engine's `generate` of any engine class)."""
END = ("ledger", "Ledger.record")
"""The trace ends when this function of the layer returns: the row is committed."""
YIELD_VALUE = dis.opmap["YIELD_VALUE"]
RESUME = dis.opmap["RESUME"]
SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
"""A frame of these resumes where its awaiting left it: never a hop of its own."""


def layer_of(module: str) -> str | None:
    """The layer of a module of the product (None: not the product's)."""
    parts = module.split(".")
    if parts[0] == "medtpe":
        return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None
    layer = OLD_LAYERS.get(parts[0], parts[0])
    return layer if layer in ALLOWED and layer != "medtpe" else None


@dataclass(eq=False)
class Stay:
    """One call of a function of the product."""

    module: str
    function: str
    layer: str
    caller: Stay | None
    thread: str

    @property
    def name(self) -> str:
        """`module.function`."""
        return f"{self.module}.{self.function}"

    def stack(self) -> Iterator[Stay]:
        """This stay, its caller, theirs, up to the door."""
        stay: Stay | None = self
        while stay is not None:
            yield stay
            stay = stay.caller


@dataclass(frozen=True)
class Hop:
    """A stay entered from another module's stay."""

    caller: Stay
    callee: Stay
    kind: str
    """`call`, `resume` (a generator driven by another module) or `thread` (work handed over)."""
    climb: str | None
    """Why the hop is a climb (None: it is not)."""


def climb_of(caller: Stay, callee: Stay) -> str | None:
    """Why the hop from `caller` into `callee` climbs (None: it goes down or stays level): a
    layer climb (`layer: ...`) or a module's (`module: ...`)."""
    if callee.layer != caller.layer and callee.layer not in ALLOWED[caller.layer]:
        return f"layer: {caller.layer} may not import {callee.layer}"
    below = list(caller.stack())[1:]
    if callee.layer != caller.layer and callee.layer in {s.layer for s in below}:
        return f"layer: re-enters {callee.layer}, left for {caller.layer}"
    if callee.layer == "core":  # the leaves' own modules call each other's generators
        return None
    if callee.module != caller.module and callee.module in {s.module for s in below}:
        return f"module: re-enters {callee.module}, left for {caller.module}"
    return None


@dataclass
class Trace:
    """The stays, hops and returns `sys.setprofile` sees in every thread while `on`."""

    on: bool = False
    ended: bool = False
    stays: dict[int, tuple[FrameType, Stay]] = field(default_factory=dict)
    hops: list[Hop] = field(default_factory=list)
    returns: int = 0
    targets: list[Stay] = field(default_factory=list)
    handed: dict[int, tuple[Any, Stay | None]] = field(default_factory=dict)
    current: contextvars.ContextVar[Stay | None] = field(
        default_factory=lambda: contextvars.ContextVar("stay", default=None)
    )

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        """The profile function of every thread."""
        if not self.on or self.ended or event not in ("call", "return"):
            return
        layer = layer_of(frame.f_globals.get("__name__", ""))
        if layer is None:
            if event == "call" and frame.f_code.co_name == "submit":
                self._handing(frame)
            return
        if event == "call":
            self._entered(frame, layer)
        else:
            self._left(frame)

    def _stay_of(self, frame: FrameType) -> Stay:
        known = self.stays.get(id(frame))
        if known is not None:
            return known[1]
        layer = layer_of(frame.f_globals["__name__"])
        assert layer is not None
        stay = Stay(frame.f_globals["__name__"], frame.f_code.co_qualname, layer, None, "")
        self.stays[id(frame)] = (frame, stay)  # a frame entered before the trace began
        return stay

    def _caller(self, frame: FrameType) -> tuple[Stay | None, bool]:
        """The stay that called `frame` and whether it is in this thread's stack (else handed
        over: a thread's work item, or a task's context)."""
        back = frame.f_back
        while back is not None:
            if layer_of(back.f_globals.get("__name__", "")) is not None:
                return self._stay_of(back), True
            item = back.f_locals.get("self") if back.f_code.co_name == "run" else None
            if item is not None and id(getattr(item, "fn", None)) in self.handed:
                return self.handed[id(item.fn)][1], False
            back = back.f_back
        return self.current.get(), False

    def _handing(self, frame: FrameType) -> None:
        fn = frame.f_locals.get("fn")
        if fn is not None:
            self.handed[id(fn)] = (fn, self._caller(frame)[0] or self.current.get())

    def _entered(self, frame: FrameType, layer: str) -> None:
        code = frame.f_code
        fresh = frame.f_lasti < 0 or (
            code.co_code[frame.f_lasti] == RESUME and code.co_code[frame.f_lasti + 1] == 0
        )
        caller, in_stack = self._caller(frame)
        if fresh:
            name = threading.current_thread().name
            stay = Stay(frame.f_globals["__name__"], code.co_qualname, layer, caller, name)
            self.stays[id(frame)] = (frame, stay)
            if caller is not None and caller.module != stay.module:
                kind = "call" if in_stack else "thread"
                self.hops.append(Hop(caller, stay, kind, climb_of(caller, stay)))
            if any(stay.function.endswith(t) for t in TARGETS):
                self.targets.append(stay)
        else:
            stay = self._stay_of(frame)
            if in_stack and caller is not None and not code.co_flags & SUSPENDABLE:
                stay.caller = caller  # a generator: resumed by whoever drives it now
                if caller.module != stay.module:
                    self.hops.append(Hop(caller, stay, "resume", climb_of(caller, stay)))
        self.current.set(stay)

    def _left(self, frame: FrameType) -> None:
        stay = self._stay_of(frame)
        code = frame.f_code
        suspended = frame.f_lasti >= 0 and code.co_code[frame.f_lasti] == YIELD_VALUE
        counted = not (suspended and code.co_flags & SUSPENDABLE)
        if counted and stay.caller is not None and stay.caller.module != stay.module:
            self.returns += 1
        if not suspended:
            del self.stays[id(frame)]
            if (stay.layer, stay.function) == END:
                self.ended = True
        self.current.set(stay.caller)

    def walk(self) -> list[Hop]:
        """The hops on the targets' stacks, in the order they were made."""
        on_path = {id(s) for target in self.targets for s in target.stack()}
        return [h for h in self.hops if id(h.callee) in on_path]


@contextmanager
def profiled() -> Iterator[Trace]:
    """A trace whose profile function is set in this thread and every thread started inside;
    it records while `trace.on`."""
    trace = Trace()
    threading.setprofile(trace.profile)
    sys.setprofile(trace.profile)
    try:
        yield trace
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def product(new: str, old: str) -> Any:
    """A module of the product by its name in this checkout or in the older layout."""
    return importlib.import_module(new if NEW_LAYOUT else old)


def service_files() -> tuple[Path, Path]:
    """The service tests' artefact and export (tests/conftest.py's `service_files`)."""
    from filelock import FileLock

    from tests.support.service_support import service_artefact

    cache = product("medtpe.core.paths", "medtpe_core.paths").cache_dir() / "test-fixtures"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(cache / "service-files.lock"):
        return service_artefact(cache)


def one_bundle() -> dict[str, Any]:
    """The first subject of the MIMIC-IV demo FHIR fixture as one Bundle."""
    from tests.support.mimic_fhir_fixture import FIXTURE

    meds = product("medtpe.core.meds", "medtpe_core.meds")
    from_meds = product("medtpe.core.fhir.from_meds", "medtpe_core.fhir.from_meds")
    dataset = meds.MedsDataset.load(FIXTURE)
    return from_meds.fhir_bundle_from_meds(dataset.events(dataset.subject_ids[0]))


def trace_service(files: tuple[Path, Path], hook: bool) -> Trace:
    """`POST /predict` with one synthetic record, or one CDS hook call with its prefetch, on the
    app in-process (the instant engine), traced from the door until its row is committed."""
    from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
    from tests.support.ehr import serving_ehr
    from tests.support.service_support import AUTH, instant_client, instant_settings, record

    base = "http://testserver"
    services = product("medtpe.core.cds.services", "medtpe_core.cds.services")
    icu = services.get_service("medtpe-icu-mortality-patient-view")
    with serving_ehr() as ehr, profiled() as trace:
        settings = instant_settings(files, **ehr.service_settings(base))
        with instant_client(settings) as client:
            if hook:
                url = f"/cds-services/{icu.id}"
                prefetch = prefetch_of(icu, load_bundle(), ICU_PATIENT)
                body, headers = hook_request(icu, ICU_PATIENT, prefetch=prefetch), {}
                headers = ehr.authorization(base + url)
            else:
                url, body, headers = "/predict", record(1, 30), AUTH
            trace.on = True
            answer = client.post(url, json=body, headers=headers)
            trace.on = False
    assert answer.status_code == 200, answer.text
    return trace


def trace_fhir(files: tuple[Path, Path]) -> Trace:
    """`medtpe predict --fhir` on an export of one patient (the instant engine, a ledger of its
    own), traced from the command until the shard's rows are committed."""
    from click.testing import CliRunner

    from tests.support.bulk_server import resources_by_type, write_export
    from tests.support.service_support import TEST_SIGNING_KEY

    fhir_job = product("medtpe.batch.fhir_job", "batch.fhir_job")
    instant = product("medtpe.inference.engines.instant", "inference.instant_engine")
    command = product("medtpe.cli.predict_commands", "medtpe_cli.predict_commands").predict
    artefact, export = files
    with tempfile.TemporaryDirectory() as tmp:
        fhir = write_export(resources_by_type([one_bundle()]), Path(tmp) / "fhir")
        os.environ["MEDTPE_LEDGER_URL"] = f"sqlite:///{tmp}/ledger.sqlite3"
        os.environ["MEDTPE_LEDGER_SIGNING_KEY"] = TEST_SIGNING_KEY
        fhir_job.run_fhir.__kwdefaults__["engine_factory"] = instant.InstantEngine.factory()
        arguments = [
            *("--fhir", str(fhir), "--task", "icu_mortality", "--times", "last"),
            *("--out", f"{tmp}/out", "--artefact", str(artefact), "--export-dir", str(export)),
            *("--max-input-tokens", "1024", "--max-new-tokens", "8"),
        ]
        with profiled() as trace:
            trace.on = True
            result = CliRunner().invoke(command, arguments)
            trace.on = False
    assert result.exit_code == 0, result.output
    return trace


PATHS: dict[str, tuple[str, Callable[[tuple[Path, Path]], Trace]]] = {
    "predict": ("POST /predict", lambda files: trace_service(files, hook=False)),
    "hook": ("a CDS hook call", lambda files: trace_service(files, hook=True)),
    "fhir": ("one patient of medtpe predict --fhir", trace_fhir),
}


def report(title: str, trace: Trace, every: bool, core: bool) -> None:
    """Print the walk (or every hop, those into `medtpe.core` with `core`): each hop's caller
    and callee, indented by the depth of the caller's stack, with their layers; then the counts
    and every climb of the trace."""
    hops = trace.walk()
    if every:
        hops = [h for h in trace.hops if core or h.callee.layer != "core"]
    print(f"== {title}: {'every hop' if every else 'the walk'}")
    for n, hop in enumerate(hops, 1):
        indent = "  " * min(sum(1 for _ in hop.caller.stack()), 12)
        layers = hop.caller.layer
        if hop.callee.layer != hop.caller.layer:
            layers += f" → {hop.callee.layer}"
        kind = "" if hop.kind == "call" else f", {hop.kind}"
        print(f"{n:3}. {indent}{hop.caller.name} → {hop.callee.name} ({layers}{kind})")
        if hop.climb:
            print(f"     {indent}CLIMB ({hop.climb})")
    climbs = [h for h in trace.hops if h.climb]
    layer_climbs = sum(1 for h in climbs if h.climb and h.climb.startswith("layer"))
    walk = trace.walk()
    into_core = sum(1 for h in trace.hops if h.callee.layer == "core")
    print(
        f"   walk: {len(walk)} hops, {sum(1 for h in walk if h.climb)} climbs; trace: "
        f"{len(trace.hops)} hops ({into_core} into core), {trace.returns} returns, "
        f"{layer_climbs} layer climbs, {len(climbs) - layer_climbs} module climbs"
    )
    for (caller, callee, why), times in Counter(
        (h.caller.name, h.callee.name, h.climb) for h in climbs
    ).items():
        print(f"   climb{f' x{times}' if times > 1 else ''}: {caller} → {callee} ({why})")


def main(argv: list[str] | None = None) -> None:
    """Trace the paths asked for and print each one's walk."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--all", action="store_true", help="print every hop, not only the walk")
    parser.add_argument("--core", action="store_true", help="with --all: hops into core too")
    args = parser.parse_args(argv)
    files = service_files()
    for name in args.paths:
        title, run = PATHS[name]
        report(title, run(files), args.all, args.core)


if __name__ == "__main__":
    main()
