"""Who reaches the state store (Valkey) and the ledger's PostgreSQL, in the shipped deployment
files: the store runs with a password from a secret, the service's MEDTPE_STATE_URL carries the
same one and MEDTPE_STATE_KEY authenticates its cached scores; Kubernetes NetworkPolicies admit
the service's pods to the store and the ledger-writing pods (service, population CronJob, Ray
predict job) to the ledger's database, compose keeps both on an internal network with the
service alone. The files are validated by tests/deploy/test_deploy_static.py's tools."""

from __future__ import annotations

import re
import shlex
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.test_deploy_static import (
    COMPOSE_REQUIRED,
    K8S,
    LEDGER_DB,
    STATE_SECRET,
    STATE_STORE,
    compose_config,
    k8s_documents,
    service_environment,
)
from tests.support.deploy_support import ROOT, settings_from_environment

LEDGER_CLIENT = "medtpe-ledger-client"
STATE_CLIENT = "medtpe-state-client"


def pod_templates() -> dict[str, dict[str, Any]]:
    """The pod template of every workload shipped in deploy/k8s/, by name."""
    store = k8s_documents(STATE_STORE)["Deployment"]
    cronjob = yaml.safe_load((K8S / "cronjob-population.yaml").read_text())
    rayjob = yaml.safe_load((K8S / "rayjob-predict.yaml").read_text())
    mine = yaml.safe_load((K8S / "rayjob-mine.yaml").read_text())
    templates = {
        "service": k8s_documents()["Deployment"]["spec"]["template"],
        "state store": store["spec"]["template"],
        "population cronjob": cronjob["spec"]["jobTemplate"]["spec"]["template"],
        "predict head": rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
        "mine head": mine["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
    }
    for job, document in (("predict", rayjob), ("mine", mine)):
        for group in document["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
            templates[f"{job} {group['groupName']} workers"] = group["template"]
    return templates


def admitted(policy: dict[str, Any]) -> set[str]:
    """The workloads whose pods `policy` admits (its one rule's pod selector)."""
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    wanted = source["podSelector"]["matchLabels"].items()
    return {
        name
        for name, template in pod_templates().items()
        if wanted <= template.get("metadata", {}).get("labels", {}).items()
    }


def test_the_kubernetes_state_store_needs_the_password_the_service_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valkey's `requirepass` is the Secret `medtpe-state`'s `password` (required), written into
    its config file, not onto its command line; the service's MEDTPE_STATE_URL carries the same
    key of the same Secret, its MEDTPE_STATE_KEY that Secret's `mac-key`; the probe
    authenticates."""
    store = k8s_documents(STATE_STORE)["Deployment"]["spec"]["template"]["spec"]
    (container,) = store["containers"]
    (password,) = [e for e in container["env"] if e["name"] == "VALKEY_PASSWORD"]
    ref = password["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("medtpe-state", "password") and "optional" not in ref
    script = container["command"][2]
    assert container["command"][:2] == ["sh", "-c"] and "exec valkey-server" in script
    assert re.search(r"printf 'requirepass %s\\n' \"\$VALKEY_PASSWORD\" > (\S+)", script)
    config_file = re.search(r"> (\S+)", script)
    assert config_file and f"valkey-server {config_file[1]}" in script
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert any(config_file[1].startswith(m + "/") for m in mounts)
    assert "requirepass" not in container["args"] and "VALKEY_PASSWORD" not in container["args"]
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert 'REDISCLI_AUTH="$VALKEY_PASSWORD"' in probe and "PONG" in probe

    settings = settings_from_environment(service_environment(), monkeypatch)
    assert settings.state_url is not None
    assert urlsplit(settings.state_url).password == STATE_SECRET[("medtpe-state", "password")]
    assert settings.state_key == STATE_SECRET[("medtpe-state", "mac-key")]
    service = k8s_documents()
    assert "MEDTPE_STATE_URL" not in service["ConfigMap"]["data"]  # it carries the password
    (api,) = service["Deployment"]["spec"]["template"]["spec"]["containers"]
    for variable in api["env"]:
        if "valueFrom" in variable and variable["valueFrom"]["secretKeyRef"]["name"] == (
            "medtpe-state"
        ):
            assert "optional" not in variable["valueFrom"]["secretKeyRef"], variable["name"]


def test_network_policies_admit_only_the_pods_that_need_each_store() -> None:
    """The store's policy selects the store's pods and admits the service's alone, on the
    store's port; the ledger database's admits the pods that write answers (the service, the
    population CronJob, the Ray predict job's head and workers) on PostgreSQL's port, and not
    the state store or the mining job."""
    store = k8s_documents(STATE_STORE)
    policy = store["NetworkPolicy"]
    pod_labels = store["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (port,) = store["Service"]["spec"]["ports"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": port["port"], "protocol": "TCP"}]
    assert admitted(policy) == {"service"}

    ledger = k8s_documents(LEDGER_DB)["NetworkPolicy"]
    assert ledger["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": LEDGER_DB}
    assert ledger["spec"]["policyTypes"] == ["Ingress"]
    assert ledger["spec"]["ingress"][0]["ports"] == [{"port": 5432, "protocol": "TCP"}]
    assert admitted(ledger) == {
        "service",
        "population cronjob",
        "predict head",
        "predict gpu workers",
    }
    # every pod that reads the ledger's URL is admitted, and only those
    readers = {
        name
        for name, template in pod_templates().items()
        for container in template["spec"]["containers"]
        for variable in container.get("env", [])
        if variable["name"] == "MEDTPE_LEDGER_URL"
    }
    assert readers <= admitted(ledger)


def test_compose_runs_the_state_store_with_the_password_the_service_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compose: Valkey's `requirepass` is the secret `state-store-password` (from the required
    STATE_STORE_PASSWORD), read from its file into a config file; the service's
    MEDTPE_STATE_URL carries the same password; its health check authenticates; the store runs
    as the image's `valkey` user."""
    config = compose_config("docker-compose.yml")
    services = config["services"]
    valkey, medtpe = services["valkey"], services["medtpe"]
    assert config["secrets"]["state-store-password"]["environment"] == "STATE_STORE_PASSWORD"
    assert [s["source"] for s in valkey["secrets"]] == ["state-store-password"]
    assert valkey["user"] == "valkey"
    script = valkey["command"][2]
    assert valkey["command"][:2] == ["sh", "-c"]
    assert "requirepass" in script and "/run/secrets/state-store-password" in script
    assert "exec valkey-server" in script
    health = shlex.join(valkey["healthcheck"]["test"])
    assert "REDISCLI_AUTH" in health and "/run/secrets/state-store-password" in health
    settings = settings_from_environment(medtpe["environment"], monkeypatch)
    assert settings.state_url is not None
    assert urlsplit(settings.state_url).password == COMPOSE_REQUIRED["STATE_STORE_PASSWORD"]
    assert settings.state_key == COMPOSE_REQUIRED["MEDTPE_STATE_KEY"]


def test_compose_keeps_the_stores_on_an_internal_network_with_the_service() -> None:
    """The state store and the ledger database are on the internal network `backend` only,
    with the service: Prometheus and Grafana cannot reach them."""
    config = compose_config("docker-compose.yml")
    services = config["services"]
    assert config["networks"]["backend"]["internal"] is True
    on_backend = {name for name, s in services.items() if "backend" in s.get("networks", {})}
    assert {"medtpe", "valkey", "ledger-db"} <= on_backend
    assert not on_backend & {"prometheus", "grafana"}
    for store in ("valkey", "ledger-db"):
        assert set(services[store]["networks"]) == {"backend"} and "ports" not in services[store]


def test_the_deployment_guide_creates_the_state_secret() -> None:
    """docs/deployment.md creates the Secret `medtpe-state` with both keys the pods read."""
    guide = (ROOT / "docs" / "deployment.md").read_text()
    create = re.search(r"kubectl create secret generic medtpe-state\b[^`]*?(?=\n\S|\n\n)", guide)
    assert create, "docs/deployment.md creates the Secret medtpe-state"
    for _, key in STATE_SECRET:
        assert re.search(rf"--from-(literal|file)={key}=", create[0]), key
