"""The nightly population CronJob (deploy/k8s/cronjob-population.yaml) without a cluster: valid
against the Kubernetes schemas, the project's image and user, its command the real `medtpe
predict --fhir-server` on the pod's volumes, the client key from the mounted Secret."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from medtpe.cli.main import cli
from tests.deploy.test_deploy_rayjobs import option_values
from tests.deploy.test_deploy_static import KUBERNETES_VERSIONS, parse_dockerfile
from tests.support.deploy_support import DEPLOY, ROOT

CRONJOB = DEPLOY / "k8s" / "cronjob-population.yaml"


def load() -> dict[str, Any]:
    (document,) = yaml.safe_load_all(CRONJOB.read_text())
    return document


def pod() -> dict[str, Any]:
    return load()["spec"]["jobTemplate"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_validates_against_the_kubernetes_schemas(version: str) -> None:
    kubernetes_validate.validate(load(), version, strict=True)


def test_kustomize_leaves_it_out_and_one_night_runs_at_a_time() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert CRONJOB.name not in kustomization["resources"]
    spec = load()["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["timeZone"]
    assert spec["jobTemplate"]["spec"]["backoffLimit"] >= 1  # a restart resumes the night


def test_the_command_is_the_real_cli_on_the_pods_paths() -> None:
    spec = pod()
    (container,) = spec["containers"]
    runtime = parse_dockerfile(ROOT / "Dockerfile")["runtime"]
    assert container["image"] in {"medtpe:cpu", "medtpe:gpu"}
    assert spec["securityContext"]["runAsUser"] == int(runtime.last("USER").split(":")[0])
    assert container["command"] == ["/bin/sh", "-c"]
    (script,) = container["args"]
    args = shlex.split(script)
    assert args[:3] == ["exec", "medtpe", "predict"]
    command = cli.commands["predict"]
    given = option_values(args[3:])
    assert set(given) <= {opt for param in command.params for opt in param.opts}
    for param in command.params:
        if param.required and isinstance(param, click.Option):
            assert set(param.opts) & set(given), param.opts
    env = runtime.env()
    assert given["--model"] == env["MEDTPE_MODEL_DIR"]
    assert given["--export-dir"] == env["MEDTPE_EXPORT_DIR"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    out = given["--out"]
    assert any(Path(out).is_relative_to(m) and not ro for m, ro in mounts.items())
    variables = {e["name"]: e for e in container["env"]}
    for name in ("FHIR_BASE_URL", "FHIR_GROUP"):
        assert f'"${name}"' in script and name in variables
    key = Path(variables["MEDTPE_FHIR_CLIENT_KEY_FILE"]["value"])
    secret_mounts = {
        m["mountPath"]
        for m in container["volumeMounts"]
        if any(v["name"] == m["name"] and "secret" in v for v in spec["volumes"])
    }
    assert any(key.is_relative_to(m) and mounts[m] for m in secret_mounts)
    assert "MEDTPE_FHIR_CLIENT_ID" in variables
    config = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["data"]
    for variable in variables.values():
        ref = variable.get("valueFrom", {}).get("configMapKeyRef")
        if ref is not None:
            assert ref["name"] == config_name() and ref["key"] in config


def config_name() -> str:
    return yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["metadata"]["name"]
