"""The cluster files: the autoscaler YAML against the schema Ray ships (and Ray's own config validation), the
KubeRay manifests against KubeRay's CRD schemas (vendored under tests/data/kuberay, from KubeRay v1.7.0; unknown
fields rejected as ``kubectl apply``'s strict field validation does), and their resources cross-checked with the
example configs: no custom resource that no config field asks for, and room for configs/gpu-cluster.yaml."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dreamgym.config import load_config
from dreamgym.placement import plan_placement

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
KUBERAY = Path(__file__).parent / "data" / "kuberay"
BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}
VARS = {"DREAMGYM_IMAGE": "registry.example.com/dreamgym:gpu-1", "DREAMGYM_AMI": "ami-0123456789abcdef0",
        "DREAMGYM_EFS_DNS": "fs-0123.efs.us-west-2.amazonaws.com"}


def substituted(path: Path) -> Any:
    """The file with its ``${VAR}`` template variables filled in (what envsubst does); every variable known."""
    text = path.read_text()
    names = set(re.findall(r"\$\{(\w+)\}", text))
    assert names <= set(VARS), f"{path.name}: undocumented template variables {names - set(VARS)}"
    for k, v in VARS.items():
        text = text.replace("${" + k + "}", v)
    return yaml.safe_load(text)


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected (objects with ``properties`` and no ``additionalProperties``)."""
    s = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def crd_schema(name: str) -> dict[str, Any]:
    return json.loads(gzip.open(KUBERAY / f"{name}-v1.json.gz").read())["openAPIV3Schema"]


def validate_crd(doc: dict[str, Any], crd: str) -> None:
    body = {k: v for k, v in doc.items() if k != "metadata"}  # the CRD leaves metadata to the API server
    jsonschema.validate(body, strict(crd_schema(crd)))


# -- the Ray autoscaler config ---------------------------------------------------------------------------
def autoscaler() -> dict[str, Any]:
    return substituted(CLUSTER / "ray-cluster.yaml")


def test_autoscaler_yaml_matches_rays_schema() -> None:
    import ray

    cfg = autoscaler()
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(cfg))  # what `ray up` runs before it talks to the cloud


def test_autoscaler_image_and_machine_image_are_variables() -> None:
    raw = yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())
    assert raw["docker"]["image"] == "${DREAMGYM_IMAGE}"
    for name, node in raw["available_node_types"].items():
        assert node["node_config"].get("ImageId") == "${DREAMGYM_AMI}", name
    text = (CLUSTER / "ray-cluster.yaml").read_text()
    assert "driver >= 580" in text and "dreamgym:gpu\n" not in text


def custom_resources_autoscaler(cfg: dict[str, Any]) -> set[str]:
    return {k for n in cfg["available_node_types"].values() for k in n.get("resources", {}) if k not in BUILTIN}


def custom_resources_kuberay(doc: dict[str, Any]) -> set[str]:
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [spec.get("headGroupSpec", {}), *spec.get("workerGroupSpecs", [])]
    out = set()
    for g in groups:
        params = g.get("rayStartParams", {})
        if "resources" in params:
            out |= set(json.loads(params["resources"].strip("'\"").replace('\\"', '"')))
        out |= set(g.get("resources", {})) - BUILTIN
    return out


def _requested_custom_resources() -> set[str]:
    """Custom Ray resources the example configs ask for (``*.resources`` fields: rollout workers, engines)."""
    out: set[str] = set()
    for path in [*sorted((REPO / "configs").glob("*.yaml")), REPO / "dreamgym" / "configs" / "train.yaml"]:
        cfg = load_config(path)
        for section in (cfg.train.rollout, cfg.policy.engine, cfg.experience_model.engine):
            out |= set(section.resources or {})
    return out


def test_no_custom_resource_that_no_config_asks_for() -> None:
    """Every custom resource a cluster file declares is one a config field requests (the config fields are
    ``train.rollout.resources`` and ``*.engine.resources``); today no example config pins a role, so the
    cluster files declare none."""
    from dreamgym.config import explain

    fields = {p for p, _, _ in explain() if p.endswith(".resources")}
    assert {"train.rollout.resources", "policy.engine.resources", "experience_model.engine.resources"} <= fields
    requested = _requested_custom_resources()
    assert custom_resources_autoscaler(autoscaler()) <= requested
    for f in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml"):
        assert custom_resources_kuberay(substituted(CLUSTER / f)) <= requested, f
    # The check itself catches the old files' resources (a `rollout` / `policy_engine` resource nothing asked for).
    bad = {"spec": {"workerGroupSpecs": [{"rayStartParams": {"resources": '"{\\"policy_engine\\": 4}"'}}]}}
    assert custom_resources_kuberay(bad) == {"policy_engine"}


def node_shapes_autoscaler(cfg: dict[str, Any]) -> list[tuple[float, float, int]]:
    """(CPUs, GPUs, max nodes) per worker node type."""
    return [(n["resources"].get("CPU", 0), n["resources"].get("GPU", 0), n.get("max_workers", 0))
            for name, n in cfg["available_node_types"].items() if name != cfg["head_node_type"]]


def fits(plan: Any, shapes: list[tuple[float, float, int]]) -> list[str]:
    cpus = sum(c * k for c, _, k in shapes)
    gpus = sum(g * k for _, g, k in shapes)
    return plan.problems(cpus, gpus, max(g for _, g, _ in shapes))


def test_example_configs_fit_the_cluster_files() -> None:
    plan = plan_placement(load_config(REPO / "configs" / "gpu-cluster.yaml"))
    assert fits(plan, node_shapes_autoscaler(autoscaler())) == []
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    shapes = []
    for g in rc["spec"]["workerGroupSpecs"]:
        lim = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        shapes.append((float(lim["cpu"]), float(lim.get("nvidia.com/gpu", 0)), g["maxReplicas"]))
    assert fits(plan, shapes) == []
    # The shape the example config's header states for --dry-run.
    assert "--cluster-gpus 8" in (REPO / "configs" / "gpu-cluster.yaml").read_text()


# -- KubeRay -------------------------------------------------------------------------------------------------
def test_raycluster_matches_the_kuberay_crd_and_autoscales() -> None:
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    validate_crd(rc, "rayclusters")
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    assert all(g["minReplicas"] == 0 for g in rc["spec"]["workerGroupSpecs"])


def test_rayjob_matches_the_kuberay_crd_and_selects_the_cluster() -> None:
    job = substituted(CLUSTER / "kuberay-rayjob.yaml")
    validate_crd(job, "rayjobs")
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}
    entry = job["spec"]["entrypoint"].split()
    assert entry[:2] == ["dreamgym", "train"] and entry[2] == "/opt/dreamgym/configs/gpu-cluster.yaml"
    load_config(REPO / "configs" / "gpu-cluster.yaml")  # the config it names: the repository's, copied into the image


def test_strict_validation_rejects_unknown_fields() -> None:
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    rc["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3  # a typo kubectl's strict validation rejects
    with pytest.raises(jsonschema.ValidationError, match="maxReplica"):
        validate_crd(rc, "rayclusters")


def test_the_shared_volume_is_defined_and_mounted_everywhere() -> None:
    pvc = yaml.safe_load((CLUSTER / "kuberay-volume.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"]
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    pods = [rc["spec"]["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"]
                                                                for g in rc["spec"]["workerGroupSpecs"]]
    for pod in pods:
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        assert claims == {"data": pvc["metadata"]["name"]}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["data"] == "/data"
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}  # secrets come as valueFrom
        assert env["HF_HOME"].startswith("/data/")


# -- KubeRay token authentication and the operator version (issue 31, defect 1) ---------------------------------------
def operator_facts() -> dict[str, Any]:
    return json.loads((KUBERAY / "operator-facts.json").read_text())


def test_kuberay_token_auth_goes_through_auth_options_of_the_stated_operator() -> None:
    """``spec.authOptions`` on every cluster spec (the operator passes the token to the autoscaler sidecar and the
    RayJob submitter only then), a submitter pod template on the RayJob, and the operator version the headers state
    is the first whose CRDs have every field the manifests use (``authOptions.secretName``: 1.6.0)."""
    facts = operator_facts()
    stated = facts["stated_minimum"]
    v = facts["versions"][stated]
    rc = substituted(CLUSTER / "kuberay-raycluster.yaml")
    job = substituted(CLUSTER / "kuberay-rayjob.yaml")
    for f in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml"):
        assert f"KubeRay operator >= {stated}" in (CLUSTER / f).read_text(), f
    assert f"operator >= {stated}" in (CLUSTER / "README.md").read_text()
    cluster_specs = [rc["spec"]] + ([job["spec"]["rayClusterSpec"]] if "rayClusterSpec" in job["spec"] else [])
    secret = re.search(r"kubectl create secret generic (\S+) --from-literal=(\w+)=",
                       (CLUSTER / "kuberay-raycluster.yaml").read_text())
    assert secret is not None
    for spec in cluster_specs:
        auth = spec.get("authOptions")
        assert auth is not None and auth["mode"] == "token", "no spec.authOptions: the autoscaler gets no token"
        assert set(spec) <= set(v["raycluster_spec"]) and set(auth) <= set(v["authOptions"])
        assert auth["mode"] in v["authOptions_mode"]
        assert (auth["secretName"], v["auth_secret_key"]) == secret.groups()  # the Secret the header creates
        # a field the previous release lacks: the stated version is the minimum
        assert not set(auth) <= set(facts["versions"]["1.5.1"]["authOptions"])
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for pod in [g["template"]["spec"] for g in groups]:
            names = {e["name"] for c in pod["containers"] for e in c.get("env", [])}
            assert not names & {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"}, "set by the operator from authOptions"
    assert v["http_probes_for_ray_2_53"] and rc["spec"]["rayVersion"] >= "2.53"  # no wget in the CUDA image
    # The RayJob: fields of the stated version, a submitter pod template in a mode that accepts one.
    assert set(job["spec"]) <= set(v["rayjob_spec"])
    assert job["spec"]["submissionMode"] in v["submitter_pod_template_modes"]
    template = job["spec"]["submitterPodTemplate"]["spec"]
    assert template["restartPolicy"] == "Never"
    head_image = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert template["containers"][0]["image"] == head_image  # the cluster's `ray` CLI
