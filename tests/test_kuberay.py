"""KubeRay: step 02 as a RayJob (02-ray-train-ddp/rayjob.yaml), checked offline. Against the v1 schema of KubeRay
v1.7.0's RayJob CRD (tests/kuberay/SOURCE.md), with Kubernetes' strict field validation, which `kubectl apply` uses:
an unknown field is an error, not dropped. And for fit (kuberay#2329: workers that never fit their group): the
step's workers fit in the worker groups' CPUs, and its checkpoints go to a volume every pod mounts."""
import copy
import functools
import gzip
import shlex

import jsonschema
import pytest
import yaml

from conftest import ROOT, parse_only

MANIFEST = ROOT / "02-ray-train-ddp" / "rayjob.yaml"
CRD = ROOT / "tests" / "kuberay" / "ray.io_rayjobs.yaml.gz"
CPUS_PER_WORKER = 1  # step 02's ScalingConfig asks Ray's default for a worker: 1 CPU (no GPU without --use-gpu)


@functools.cache
def rayjob_schema() -> dict:
    crd = yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [v1] = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    return strict(v1["schema"]["openAPIV3Schema"])


def strict(schema: dict) -> dict:
    """The schema with every object that lists its fields closed to others, as the API server's strict field
    validation closes them (not where the CRD keeps unknown fields: x-kubernetes-preserve-unknown-fields)."""
    schema = copy.deepcopy(schema)
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and \
                    not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            todo += node.values()
        elif isinstance(node, list):
            todo += node
    return schema


def errors(manifest: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(rayjob_schema())  # the schema is the CRD's OpenAPI v3 subset
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(manifest)]


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def step_flags(job: dict):
    """The step's flags as its parser reads them, from the RayJob's entrypoint (`cd DIR && python SCRIPT FLAGS`)."""
    words = shlex.split(job["spec"]["entrypoint"].split("&&")[-1])
    assert words[:2] == ["python", "02-ray-train-ddp/train_ray_ddp.py"], words
    return parse_only(str(ROOT / words[1]), *words[2:])[1]


def cpus(group: dict) -> float:
    """What Ray counts in each pod of a group: rayStartParams' num-cpus, else the container's CPU limit."""
    if "num-cpus" in group.get("rayStartParams", {}):
        return float(group["rayStartParams"]["num-cpus"])
    [container] = group["template"]["spec"]["containers"]
    return float(container["resources"]["limits"]["cpu"])


def workers_fit(job: dict) -> bool:
    """Whether the step's workers fit, one CPU each, in the pods the worker groups keep (their minReplicas) and
    the head."""
    cluster, workers = job["spec"]["rayClusterSpec"], step_flags(job).num_workers
    slots = int(cpus(cluster["headGroupSpec"]) // CPUS_PER_WORKER) + sum(
        int(cpus(group) // CPUS_PER_WORKER) * group.get("minReplicas", group.get("replicas", 0))
        for group in cluster["workerGroupSpecs"])
    return workers <= slots


def test_the_manifest_is_a_rayjob_that_kuberay_accepts():
    assert errors(manifest()) == []


@pytest.mark.parametrize("change, error", [
    (lambda job: job["spec"]["rayClusterSpec"].update(workerGroupSpec=[]),
     "Additional properties are not allowed ('workerGroupSpec' was unexpected)"),
    (lambda job: job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas="two"), "'two' is not of type"),
    (lambda job: job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0].pop("name"),
     "'name' is a required property"),
])
def test_a_wrong_field_is_refused(change, error):
    """What the schema check catches: a misspelt field (which a lenient apply would drop), a wrong type, a missing
    required one."""
    job = manifest()
    change(job)
    assert any(error in found for found in errors(job)), errors(job)


def test_the_steps_workers_fit_its_worker_groups_and_none_lands_on_the_head():
    job = manifest()
    assert workers_fit(job) and cpus(job["spec"]["rayClusterSpec"]["headGroupSpec"]) == 0
    smaller = manifest()
    smaller["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"] = 1
    smaller["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"]["cpu"] = "1"
    assert not workers_fit(smaller)  # 2 workers, 1 CPU in the one pod kept: the run would wait for the second


def test_the_checkpoints_and_data_are_on_the_volume_every_pod_mounts():
    job = manifest()
    flags, cluster = step_flags(job), job["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        claims = {volume["name"]: volume["persistentVolumeClaim"]["claimName"] for volume in spec["volumes"]}
        [container] = spec["containers"]
        mounted = {mount["mountPath"]: claims[mount["name"]] for mount in container["volumeMounts"]}
        for path in (flags.checkpoint_dir, flags.data_dir):
            assert any(path.startswith(f"{mount}/") and claim == "workshop-shared" for mount, claim in
                       mounted.items()), (group.get("groupName", "head"), path)
