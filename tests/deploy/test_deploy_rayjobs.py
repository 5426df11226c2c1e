"""Checks of the KubeRay jobs (deploy/k8s/rayjob-*.yaml) without a cluster.

kubernetes-validate has no schema for KubeRay's RayJob resource (a CRD), so the RayJob fields
are checked here by hand (the parts KubeRay acts on: entrypoint, Ray version, start parameters,
replicas, the command annotation), while every pod template the job starts (head and worker
groups) is validated strictly against the Kubernetes schemas as a PodTemplate. The entrypoint is
checked against the real CLI (commands and options exist, required options given), the images
against the Dockerfile, and the paths it reads and writes against the pods' volume mounts.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import yaml

from medtpe.cli.main import cli
from tests.deploy.test_deploy_static import KUBERNETES_VERSIONS, k8s_documents, parse_dockerfile
from tests.support.deploy_support import DEPLOY, ROOT

K8S = DEPLOY / "k8s"
RAYJOBS = sorted(K8S.glob("rayjob-*.yaml"))
RAY_CONTAINER_NAMES = {"ray-head", "ray-worker"}


def load(path: Path) -> dict[str, Any]:
    (document,) = yaml.safe_load_all(path.read_text())
    return document


def pod_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Group name ("head" or the worker group's) -> the pod template KubeRay starts."""
    cluster = job["spec"]["rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster["workerGroupSpecs"]:
        templates[group["groupName"]] = group["template"]
    return templates


def entrypoint_commands(job: dict[str, Any]) -> list[list[str]]:
    """The entrypoint's commands (joined with &&), each as its argument list."""
    return [shlex.split(part) for part in job["spec"]["entrypoint"].split("&&")]


def option_values(args: list[str]) -> dict[str, str]:
    """`--name value` pairs of an argument list (flags without a value map to "")."""
    values = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else "--"
            values[arg] = "" if following.startswith("--") else following
    return values


def test_there_are_rayjobs_and_kustomize_leaves_them_out() -> None:
    assert [p.name for p in RAYJOBS] == ["rayjob-mine.yaml", "rayjob-predict.yaml"]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert not {p.name for p in RAYJOBS} & set(kustomization["resources"])
    assert "RayJob" not in k8s_documents()  # the service's manifests stay CRD-free


@pytest.mark.parametrize("path", RAYJOBS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_pod_templates_validate_against_the_kubernetes_schemas(path: Path, version: str) -> None:
    for template in pod_templates(load(path)).values():
        document = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "rayjob-pod"},
            "template": template,
        }
        kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("path", RAYJOBS, ids=lambda p: p.name)
def test_rayjob_fields_kuberay_acts_on(path: Path) -> None:
    job = load(path)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["backoffLimit"] == 0  # a failed job is looked at, not silently re-run
    # the Ray version KubeRay expects is the one the `ray` extra installs
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (ray_requirement,) = extras["ray"]
    lower, upper = re.search(r">=([\d.]+),<([\d.]+)", ray_requirement).groups()
    ray_version = tuple(int(x) for x in spec["rayClusterSpec"]["rayVersion"].split("."))
    assert tuple(map(int, lower.split("."))) <= ray_version < tuple(map(int, upper.split(".")))
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head["dashboard-host"] == "0.0.0.0"  # the submitter talks to the job server
    assert head["num-cpus"] == "0"  # the driver's merge keeps the head's CPUs
    for group in cluster["workerGroupSpecs"]:
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert job["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"


@pytest.mark.parametrize("path", RAYJOBS, ids=lambda p: p.name)
def test_pods_run_the_project_image_as_its_user_with_ray_start(path: Path) -> None:
    stages = parse_dockerfile(ROOT / "Dockerfile")
    user = int(stages["runtime"].last("USER").split(":")[0])
    for variant in ("cpu", "gpu"):  # both images carry Ray
        runs = " ; ".join(args for name, args in stages[f"{variant}-build"].instructions)
        assert re.search(r'"\.\[[\w,]*\bray\b[\w,]*\]"', runs), f"{variant} image lacks ray"
    for template in pod_templates(load(path)).values():
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == user
        (container,) = pod["containers"]
        assert container["name"] in RAY_CONTAINER_NAMES
        assert container["image"] in {"medtpe:cpu", "medtpe:gpu"}
        # KubeRay's generated `ray start`, in a non-login shell (PATH from the image's ENV)
        assert container["command"] == ["/bin/bash", "-c", "--"]
        (args,) = container["args"]
        assert '"$KUBERAY_GEN_RAY_START_CMD"' in args and "ulimit -n" in args
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources[kind])


@pytest.mark.parametrize("path", RAYJOBS, ids=lambda p: p.name)
def test_entrypoint_is_the_real_cli_on_the_mounted_paths(path: Path) -> None:
    job = load(path)
    mounts_of = [
        {
            m["mountPath"]: m.get("readOnly", False)
            for m in t["spec"]["containers"][0]["volumeMounts"]
        }
        for t in pod_templates(job).values()
    ]

    def mount_of(value: str) -> tuple[str, bool]:
        """The mount holding `value`, the same in every pod (tasks open files by path)."""
        found = {
            (m, ro)
            for mounts in mounts_of
            for m, ro in mounts.items()
            if Path(value).is_relative_to(m)
        }
        assert len(found) == 1, f"{value}: not on one volume every pod mounts alike ({found})"
        assert all(any(Path(value).is_relative_to(m) for m in mounts) for mounts in mounts_of)
        return found.pop()

    # the model files are the image's, written by the Dockerfile's `prepare` stage (the runtime
    # has no training extra for `medtpe prepare-model`): the same paths in every pod
    runtime = parse_dockerfile(ROOT / "Dockerfile")["runtime"].env()
    image_paths = {
        "--base": runtime["MEDTPE_MODEL_DIR"],
        "--model": runtime["MEDTPE_MODEL_DIR"],
        "--export-dir": runtime["MEDTPE_EXPORT_DIR"],
        "--artefact": runtime["MEDTPE_ARTEFACT_DIR"],
    }
    commands = entrypoint_commands(job)
    ray_used = False
    for args in commands:
        assert args[0] == "medtpe"
        command = cli.commands[args[1]]
        options = {opt for param in command.params for opt in param.opts}
        given = option_values(args[2:])
        assert set(given) <= options, set(given) - options
        for param in command.params:
            if param.required and isinstance(param, click.Option):
                assert set(param.opts) & set(given), f"{args[1]}: {param.opts} missing"
        if "--ray" in given:
            ray_used = True
            assert given["--ray"] == "auto"  # the driver runs inside the job's cluster
        assert args[1] != "prepare-model", "the runtime image cannot prepare the model"
        if args[1] == "predict":  # its defaults are under MEDTPE_CACHE_DIR, not the image's
            assert {"--model", "--export-dir"} <= set(given)
        for option, path in image_paths.items():
            if option in given:
                assert given[option] == path, f"{option}: not the image's {path}"
        for option in ("--corpus", "--meds", "--labels"):
            if option in given:
                mount_of(given[option])
        if "--out" in given:
            assert mount_of(given["--out"])[1] is False, "--out on a read-only volume"
    assert ray_used
    # the engines the job asks for fit the GPUs its worker groups request
    given = option_values(commands[-1][2:])
    wanted = int(given.get("--engines", "1")) * float(given.get("--engine-gpus", "0"))
    gpus = 0
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        resources = group["template"]["spec"]["containers"][0]["resources"]
        per_pod = resources["limits"].get("nvidia.com/gpu", 0)
        assert resources["requests"].get("nvidia.com/gpu", 0) == per_pod
        gpus += group["minReplicas"] * per_pod
    assert wanted <= gpus
