"""KubeRay: step 02 as a RayJob (02-ray-train-ddp/rayjob.yaml), checked offline. Against the v1 schema of KubeRay
v1.7.0's RayJob CRD (tests/kuberay/SOURCE.md), with Kubernetes' strict field validation, which `kubectl apply` uses:
an unknown field is an error, not dropped. And for fit (kuberay#2329: workers that never fit their group): the
step's workers fit in the worker groups' CPUs, and its checkpoints go to a volume every pod mounts."""
import contextlib
import copy
import functools
import gzip
import json
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import ROOT, SMOKE, parse_only
from early import takes
from hosts import PATH, can_make_hosts, hosts

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


CODE = "/mnt/shared/workshop"  # where the volume holds this repository


def step_flags(job: dict):
    """The step's flags as its parser reads them, from the RayJob's entrypoint (`python SCRIPT FLAGS`)."""
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:2] == ["python", f"{CODE}/02-ray-train-ddp/train_ray_ddp.py"], words
    return parse_only(str(ROOT / Path(words[1]).relative_to(CODE)), *words[2:])[1]


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


def test_the_entrypoint_is_one_command_that_bash_passes_on_unchanged():
    """KubeRay pastes it unquoted into a bash line (submitter_command): no operator, quote, variable or glob that
    bash would read before Ray does. The job's code comes from the volume, on every process of the job."""
    job = manifest()
    entrypoint = job["spec"]["entrypoint"]
    assert not set(entrypoint) & set("&|;<>()$`\\\"'*?[]#~{}"), entrypoint
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]["PYTHONPATH"] == CODE
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}


def test_the_job_installs_cpu_wheels_of_the_versions_requirements_txt_pins():
    """The pods have no GPU: torch's +cpu builds, which PyTorch's index alone has (PyPI's carries CUDA), at
    requirements.txt's versions."""
    pip = yaml.safe_load(manifest()["spec"]["runtimeEnvYAML"])["pip"]
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
    assert {f"torch=={pins['torch']}+cpu", f"torchvision=={pins['torchvision']}+cpu"} <= set(pip["packages"])
    assert pip["pip_install_options"] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


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


# KubeRay v1.7.0 (tests/kuberay/SOURCE.md's commit), ray-operator/controllers/ray/: the submitter's command.
DASHBOARD_PORT = 8265  # utils.DefaultDashboardPort
HEALTH_COMMAND = """python -c "import urllib.request; r=urllib.request.urlopen('%s', timeout=%d); exit(0 if b'success' in r.read() else 1)\""""  # noqa: E501 (utils.BasePythonHealthCommand, verbatim)


def go_quote(text: str) -> str:
    """Go's strconv.Quote, for printable text: a JSON string."""
    return json.dumps(text, ensure_ascii=False)


def yaml_to_json(text: str) -> str:
    """sigs.k8s.io/yaml's YAMLToJSON: Go's json.Marshal of the parsed YAML (keys sorted, compact, HTML escaped)."""
    encoded = json.dumps(yaml.safe_load(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return encoded.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def submitter_command(job: dict, dashboard: str, job_id: str) -> list[str]:
    """The submitter Job's container command for this RayJob, as KubeRay v1.7.0 makes it (K8sJobMode): the words
    of submit_words joined with spaces by rayjob_controller.go's configureSubmitterContainer into one argument of
    utils.GetContainerCommand's `/bin/bash -ce --`. The entrypoint is pasted in unquoted: bash reads it first."""
    return ["/bin/bash", "-ce", "--", " ".join(submit_words(job, dashboard, job_id))]


def submit_words(job: dict, dashboard: str, job_id: str) -> list[str]:
    """common/job.go's BuildJobSubmitCommand, K8sJobMode: dashboard is the RayJob's status.dashboardURL, job_id
    its status.jobId."""
    spec, address = job["spec"], dashboard if dashboard.startswith("http://") else f"http://{dashboard}"
    words = ["until", HEALTH_COMMAND % (f"{address}/api/gcs_healthz", 10), ">/dev/null", "2>&1", ";",
             "do", "echo", go_quote(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."), ";",
             "sleep", "2", ";", "done", ";",
             "if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";", "then",
             "ray", "job", "submit", "--address", address, "--no-wait"]
    if spec.get("runtimeEnvYAML"):
        words += ["--runtime-env-json", go_quote(yaml_to_json(spec["runtimeEnvYAML"]))]
    if spec.get("metadata"):
        words += ["--metadata-json", go_quote(json.dumps(spec["metadata"], sort_keys=True, separators=(",", ":")))]
    words += ["--submission-id", job_id]
    for field, flag in (("entrypointNumCpus", "--entrypoint-num-cpus"), ("entrypointNumGpus", "--entrypoint-num-gpus")):
        if spec.get(field, 0) > 0:
            words += [flag, f"{spec[field]:f}"]
    if spec.get("entrypointResources"):
        words += ["--entrypoint-resources", go_quote(spec["entrypointResources"])]
    return [*words, "--", spec["entrypoint"].strip(), ";", "fi", ";",
            "ray", "job", "logs", "--address", address, "--follow", job_id]


def test_the_submit_command_is_kuberays_own():
    """KubeRay v1.7.0's own test of BuildJobSubmitCommand in K8sJobMode (common/job_test.go,
    TestBuildJobSubmitCommandWithK8sJobMode), its RayJob and its expected words, verbatim."""
    job = {"spec": {"runtimeEnvYAML": "test: test", "metadata": {"testKey": "testValue"},
                    "entrypoint": "echo no quote 'single quote' \"double quote\"", "entrypointNumCpus": 1,
                    "entrypointNumGpus": 0.5, "entrypointResources": '{"Custom_1": 1, "Custom_2": 5.5}'}}
    address = "http://127.0.0.1:8265"
    assert submit_words(job, address, "testJobId") == [
        "until", HEALTH_COMMAND % (f"{address}/api/gcs_healthz", 10), ">/dev/null", "2>&1", ";",
        "do", "echo", '"Waiting for Ray Dashboard GCS to become healthy at http://127.0.0.1:8265 ..."', ";", "sleep",
        "2", ";", "done", ";",
        "if", "!", "ray", "job", "status", "--address", address, "testJobId", ">/dev/null", "2>&1", ";", "then",
        "ray", "job", "submit", "--address", address, "--no-wait",
        "--runtime-env-json", '"{\\"test\\":\\"test\\"}"',
        "--metadata-json", '"{\\"testKey\\":\\"testValue\\"}"',
        "--submission-id", "testJobId",
        "--entrypoint-num-cpus", "1.000000",
        "--entrypoint-num-gpus", "0.500000",
        "--entrypoint-resources", '"{\\"Custom_1\\": 1, \\"Custom_2\\": 5.5}"',
        "--", "echo no quote 'single quote' \"double quote\"", ";", "fi", ";",
        "ray", "job", "logs", "--address", address, "--follow", "testJobId"]


# The step as a test runs it: the manifest's entrypoint, then flags for one short epoch on synthetic images (the
# later of two values of a flag wins).
SHORT_RUN = [*SMOKE, "--epochs", "1", "--steps-per-epoch", "2"]
SUBMITTER_TIMEOUT_S, HEAD_START_S = 300, 120


def cluster_of(job: dict) -> dict:
    """The Ray pods KubeRay makes for the job, {name: the CPUs Ray counts there}: a head, and each worker group's
    minReplicas."""
    cluster = job["spec"]["rayClusterSpec"]
    pods = {"head": cpus(cluster["headGroupSpec"])}
    for group in cluster["workerGroupSpecs"]:
        pods |= {f"{group['groupName']}-{i}": cpus(group) for i in range(group["minReplicas"])}
    return pods


def copy_repository(to: Path) -> None:
    """This repository's files as git tracks them (the working tree's version), as the volume holds them."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)


def cluster_ready(dashboard: str, token: str | None, nodes: list, seconds: float) -> bool:
    """Whether, within these seconds and while every node runs, the head's dashboard counts every node alive. (The
    submitter then waits for the GCS without end: KubeRay's loop has no deadline.)"""
    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while all(node.poll() is None for node in nodes) and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            request = urllib.request.Request(f"{dashboard}/api/v0/nodes", headers=headers)
            with urllib.request.urlopen(request, timeout=5) as answer:
                listed = json.loads(answer.read())["data"]["result"]["result"]
            if sum(node["state"] == "ALIVE" for node in listed) == len(nodes):
                return True
        time.sleep(1)
    return False


def ray_image_packages() -> Path:
    """What rayproject/ray's image holds beyond this venv: ray[default]'s packages (the dashboard's HTTP server, its
    job API), as pip resolves them against this venv, installed apart (once per venv) for the pods' PYTHONPATH
    alone. The suite's other Rays stay as requirements.txt makes them: with them, every ray.init would serve a
    dashboard and run its agents."""
    target = Path(sys.prefix) / "ray-image-packages"
    if not (target / "COMPLETE").exists():
        report = target.with_suffix(".json")
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
        subprocess.run([*pip, "--dry-run", "--report", str(report), "ray[default]==2.60.0"], check=True, timeout=300)
        missing = [f"{package['metadata']['name']}=={package['metadata']['version']}"
                   for package in json.loads(report.read_text())["install"]]
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([*pip, "--no-deps", "--target", str(target), *missing], check=True, timeout=600)
        (target / "COMPLETE").write_text("\n".join(missing))
    return target


def shown(logs: Path) -> str:
    """Each pod's Ray output, the end of each file."""
    return "\n".join(f"--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(logs.iterdir()))


@takes(200)  # 105 s alone (Intel Xeon, 2 cores, 2026-12-03): most of it Ray starting on four hosts
def rayjob_through_kuberays_submitter(folder: Path, lane) -> dict:
    """rayjob.yaml as KubeRay v1.7.0 runs it, each pod a host of its own (tests/hosts.py): the head (ray start
    --head, its dashboard open to the other pods), the worker pods (ray start, once the head's GCS answers, as
    KubeRay's init container waits), each with the volume at /mnt/shared, this repository at /mnt/shared/workshop;
    then the submitter pod, without the volume, runs KubeRay's own command (submitter_command). With authOptions'
    token mode, every pod gets RAY_AUTH_MODE and RAY_AUTH_TOKEN, as KubeRay sets them. The pods' image is this venv:
    the runtime environment's pip packages (checked apart: test_the_job_installs_cpu_wheels_...) are in it
    already, and Ray would clone the 6.5 GB venv on every node to install them again."""
    job = manifest()
    spec = job["spec"]
    spec["entrypoint"] = f"{spec['entrypoint'].strip()} {' '.join(SHORT_RUN)}"
    runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "{}")
    runtime_env.pop("pip", None)
    spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env) if runtime_env else ""
    volume = folder / "workshop-shared"
    copy_repository(volume / "workshop")
    env = {"PATH": PATH,
           "PYTHONPATH": str(ray_image_packages())}
    if job["spec"]["rayClusterSpec"].get("authOptions", {}).get("mode") == "token":
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    pods, job_id = cluster_of(job), f"{job['metadata']['name']}-{secrets.token_hex(4)}"
    logs = folder / "logs"
    logs.mkdir()

    def start(host, script: str):
        with (logs / f"{host.name}.out").open("w") as out, (logs / f"{host.name}.err").open("w") as err:
            return lane.start(host.command(script), env=env, stdout=out, stderr=err)

    with hosts(folder, [*pods, "submitter"], shared={"/mnt/shared": volume}, mounted_by=list(pods)) as cluster:
        nodes = []
        for name, count in pods.items():
            join = "--head --dashboard-host=0.0.0.0" if name == "head" else "--address=head:6379"
            wait = "" if name == "head" else "until ray health-check --address head:6379 2>/dev/null; do sleep 1; done"
            nodes.append(start(cluster[name], f"{wait}\nexec ray start {join} --num-cpus={count:g} --block"))
        # KubeRay submits once the cluster is ready: every pod running, each worker's raylet up.
        dashboard = f"http://{cluster['head'].address}:{DASHBOARD_PORT}"
        if not cluster_ready(dashboard, env.get("RAY_AUTH_TOKEN"), nodes, HEAD_START_S):
            return dict(not_ready=True, logs=shown(logs))
        submitter = cluster["submitter"]
        command = shlex.join(submitter_command(job, f"head:{DASHBOARD_PORT}", job_id))
        submitted = lane.run(submitter.command(f"cd $HOME && {command}"), timeout=SUBMITTER_TIMEOUT_S, env=env)
        status = lane.run(submitter.command(f"ray job status --address http://head:{DASHBOARD_PORT} {job_id}"),
                          timeout=60, env=env)
    return dict(submitted=submitted, status=status, logs=shown(logs),
                checkpoints=sorted(str(p.relative_to(volume)) for p in volume.glob("checkpoints/*/*/checkpoint.pt")))


@pytest.mark.skipif(not can_make_hosts(), reason="needs root: network, mount and PID namespaces (tests/hosts.py)")
@pytest.mark.early(run=rayjob_through_kuberays_submitter)
def test_the_rayjob_trains_through_kuberays_own_submit_command(early_run):
    assert not early_run.get("not_ready"), f"the Ray cluster was not up within {HEAD_START_S} s:\n{early_run['logs']}"
    submitted, status = early_run["submitted"], early_run["status"]
    detail = f"{submitted.stdout[-3000:]}\n{submitted.stderr[-3000:]}\n{early_run['logs']}"
    assert submitted.returncode == 0, detail
    assert re.search(r"Job '[\w-]+' succeeded", status.stdout), detail + status.stdout + status.stderr
    assert '{"step": "ray_ddp", "world_size": 2, ' in submitted.stdout, detail
    assert len(early_run["checkpoints"]) == 1, detail  # epoch 1's, on the volume every Ray pod mounts
