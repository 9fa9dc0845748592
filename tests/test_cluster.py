"""README's "Running on a cluster", run as written on two hosts (tests/hosts.py): each its own address, home, /tmp
and processes, and nothing shared but /mnt/shared, as an NFS export would be. Ray 2.60's token generated on the head
and copied to the other node's ~/.ray/, as README says; the head, then a node that joins it by the head's address;
step 02 run from that node on both, its checkpoints and summary on the shared folder; `ray stop` on each. A node
whose token was not copied, and a node or a step without RAY_AUTH_MODE, are refused."""
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, SMOKE
from early import takes
from hosts import PATH, Host, can_make_hosts, hosts

COMMAND_TIMEOUT_S = 120  # each command; the lane's wait a little longer, for the command's own end to be seen
SHARED = "/mnt/shared"  # README's SHARED: storage every node sees


def run_on(lane, host: Host, command: str, env: dict, before: str = "") -> subprocess.CompletedProcess:
    """command on the host, from the repository (after the lines before), ended at COMMAND_TIMEOUT_S."""
    script = f"cd {ROOT}\n{before}\ntimeout {COMMAND_TIMEOUT_S} {command}"
    return lane.run(host.command(script), timeout=COMMAND_TIMEOUT_S + 30, env=env)


def readme_cluster_commands() -> list:
    section = (ROOT / "README.md").read_text().split("## Running on a cluster")[1].split("\n## ")[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [" ".join(line.split("  #")[0].split()) for line in block.splitlines() if line.strip()]


@takes(160)  # 108 to 118 s beside a lab check (Intel Xeon); the full suite: 125, 151 s (AMD EPYC Zen 4, 2026-12-04)
def two_ray_hosts_by_hand(folder: Path, lane) -> dict:
    """README's cluster commands as written, on a head host and a node host (one CPU each, so that the step's two
    workers need both): the token on the head, the head; the node without RAY_AUTH_MODE, then before its token is
    copied (both refused); the token copied, the node; the step from the node without RAY_AUTH_MODE (refused), then
    with it; `ray stop` on each. An early run: most of it Ray starting. Each command's exit code and output by its
    name, and the checkpoints on the shared folder."""
    export, generate, head, join, step = readme_cluster_commands()
    assert (export, generate, head, join) == ("export RAY_AUTH_MODE=token", "ray get-auth-token --generate",
                                              "ray start --head --port=6379", "ray start --address=HEAD_IP:6379")
    assert step.startswith("python 02-ray-train-ddp/train_ray_ddp.py --address HEAD_IP:6379 ")
    shared = folder / "nfs"
    shared.mkdir()
    env = {"PATH": PATH}
    done = {}
    with hosts(folder, ["head", "node"], shared={SHARED: shared}) as cluster:
        head_ip = cluster["head"].address
        join = join.replace("HEAD_IP", head_ip) + " --num-cpus 1"
        step = f"python 02-ray-train-ddp/train_ray_ddp.py --address {head_ip}:6379 --num-workers 2 {' '.join(SMOKE)} " \
               f"--epochs 1 --checkpoint-dir {SHARED}/checkpoints"

        def on(host: str, name: str, command: str) -> None:
            done[name] = run_on(lane, cluster[host], command, env, before=export)

        on("head", "generate", generate)
        on("head", "head", head + " --num-cpus 1")
        on("node", "node_without_mode", "env -u RAY_AUTH_MODE " + join)
        on("node", "node_without_token", join)
        token = Path(".ray") / "auth_token"  # scp head:.ray/auth_token .ray/, as a person would
        (cluster["node"].root / "home" / token).parent.mkdir(exist_ok=True)
        shutil.copy(cluster["head"].root / "home" / token, cluster["node"].root / "home" / token)
        on("node", "join", join)
        on("node", "step_without_mode", "env -u RAY_AUTH_MODE " + step)
        on("node", "step", step)
        for host in cluster:
            # What ray stop left: every process on the host that is not this command's, whose first is then a
            # child of the host's PID 1 (a daemon, reparented when ray start ended).
            on(host, f"stop_{host}", "ray stop\necho left: $(ps --ppid 1 --no-headers | wc -l)")
    checkpoints = sorted(str(path.relative_to(shared)) for path in shared.glob("checkpoints/*/*/*.pt"))
    return dict(done=done, head=f"{head_ip}:6379", checkpoints=checkpoints)


def shown(done: dict) -> str:
    return "\n".join(f"--- {name}: exit {result.returncode}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
                     for name, result in done.items())


@pytest.mark.skipif(not can_make_hosts(), reason="needs root: network, mount and PID namespaces (tests/hosts.py)")
@pytest.mark.early(run=two_ray_hosts_by_hand)
def test_readmes_two_ray_nodes_by_hand_train_step_02_on_both_and_refuse_whoever_lacks_the_token(early_run):
    done, detail = early_run["done"], shown(early_run["done"])
    for name in ("generate", "head", "join", "step", "stop_head", "stop_node"):
        assert done[name].returncode == 0, f"{name} failed\n{detail}"
    for host in ("head", "node"):
        assert done[f"stop_{host}"].stdout.splitlines()[-1] == "left: 0", detail  # ray stop stopped the host's Ray
    assert done["node_without_mode"].returncode != 0 and "InvalidAuthToken" in done["node_without_mode"].stderr
    # The node's home is its own: the token is there only once copied, as README says.
    assert done["node_without_token"].returncode != 0, detail
    assert "Token authentication is enabled but no authentication token was found" in \
           done["node_without_token"].stderr, detail
    refused = [line for line in done["step_without_mode"].stderr.splitlines() if line.startswith("error:")]
    assert len(refused) == 1, detail
    assert refused[0].startswith(f"error: the Ray cluster at --address {early_run['head']} refused this driver "
                                 "(Failed to connect to Ray cluster at "), detail
    assert refused[0].endswith("if its head uses token authentication, set RAY_AUTH_MODE=token here and copy the "
                               "head's ~/.ray/auth_token to this machine's ~/.ray/ (README: Running on a cluster)")
    assert "Traceback" not in done["step_without_mode"].stderr
    step = done["step"].stdout
    assert "| 2 x cpu on 2 node(s)," in step, detail  # the two workers, one on each host
    # rank 0's summary, read back by the driver on the other host or its own: through the shared folder
    assert step.splitlines()[-1].startswith('{"step": "ray_ddp", "world_size": 2'), detail
    assert len(early_run["checkpoints"]) == 1, detail  # epoch 1's, where both hosts see it


BUCKET = "s3://runs/workshop"  # README's "(or s3://)": storage every node reaches, no folder shared at all


@takes(150)  # 62 s alone (Intel Xeon, 2026-12-04); the full suite: 101 and 144 s (AMD EPYC Zen 4, 2026-12-04)
def checkpoints_in_a_bucket(folder: Path, lane) -> dict:
    """Step 02 with its checkpoints in an S3 bucket, on three hosts that share no folder: an S3 API server (moto's,
    a stand-in for S3 or MinIO) on one, a Ray head and a node joining it on the others (one CPU each, so the
    step's two workers need both), the AWS variables in every shell, as Ray's workers read the bucket too. The step
    from the node for 2 epochs, a worker crashing after epoch 1 (--fail-at-epoch: Ray restarts the group from the
    checkpoint in the bucket); then --resume for a third epoch from a fresh driver on the head. Each command's exit
    code and output by its name, and the bucket's keys."""
    env = {"PATH": PATH, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32), "AWS_ACCESS_KEY_ID": "workshop",
           "AWS_SECRET_ACCESS_KEY": "workshop", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://storage:9000"}
    done = {}
    with hosts(folder, ["storage", "head", "node"]) as cluster:
        def on(host: str, name: str, command: str) -> None:
            done[name] = run_on(lane, cluster[host], command, env)

        with (folder / "s3.log").open("w") as log:
            lane.start(cluster["storage"].command("exec moto_server -H 0.0.0.0 -p 9000"), env=env, stdout=log,
                       stderr=log)
        bucket = BUCKET.removeprefix("s3://").split("/")[0]
        on("head", "bucket", f"""bash -c 'until python -c "import boto3; boto3.client(\\"s3\\").create_bucket(\
Bucket=\\"{bucket}\\")" 2>/dev/null; do sleep 0.5; done'""")
        head = f"{cluster['head'].address}:6379"
        on("head", "head", "ray start --head --port=6379 --num-cpus 1")
        on("node", "join", f"ray start --address={head} --num-cpus 1")
        step = f"python 02-ray-train-ddp/train_ray_ddp.py --address {head} --num-workers 2 {' '.join(SMOKE)} " \
               f"--checkpoint-dir {BUCKET}"
        on("node", "step", f"{step.replace('--epochs 2', '--epochs 2 --fail-at-epoch 1')}")
        on("head", "resume", f"{step.replace('--epochs 2', '--epochs 3')} --resume")
        on("head", "keys", """python -c "import boto3; print('\\n'.join(o['Key'] for o in boto3.client('s3')\
.list_objects_v2(Bucket='runs')['Contents']))\"""")
    return done


@pytest.mark.skipif(not can_make_hosts(), reason="needs root: network, mount and PID namespaces (tests/hosts.py)")
@pytest.mark.early(run=checkpoints_in_a_bucket)
def test_a_run_checkpointed_to_s3_restarts_from_the_bucket_and_resumes_by_name_from_another_host(early_run):
    done, detail = early_run, shown(early_run)
    for name in ("bucket", "head", "join", "step", "resume", "keys"):
        assert done[name].returncode == 0, f"{name} failed\n{detail}"
    step, resume = done["step"].stdout, done["resume"].stdout
    assert "| 2 x cpu on 2 node(s)," in step, detail
    where = f"(?:s3://)?{BUCKET.removeprefix('s3://')}"  # Ray names paths in a bucket without its scheme
    run = re.search(rf"run {where}/(ray_ddp-[\d-]+):", step).group(1)
    # The group restarted from epoch 1's checkpoint in the bucket, then a fresh driver on the other host went on
    assert re.search(rf"resumed from {where}/{run}/checkpoint_\S+ after epoch 1", step), detail
    assert re.search(rf"resumed from {where}/{run}/checkpoint_\S+ after epoch 2", resume), detail
    assert [line.split(" |")[0] for line in resume.splitlines() if line.startswith("epoch ")] == ["epoch 3/3"], detail
    assert resume.splitlines()[-1] == "the run's summary is kept in a local or mounted --checkpoint-dir only, not in " \
                                      f"{BUCKET}/{run}", detail  # as step 02's README says
    keys = done["keys"].stdout.split()  # the 2 best that CheckpointConfig keeps, in the bucket
    assert sum(key.startswith(f"workshop/{run}/checkpoint_") and key.endswith("/checkpoint.pt") for key in keys) == 2
