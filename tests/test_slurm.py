"""SLURM, run for real: step 01's and step 02's batch scripts submitted with sbatch to a SLURM cluster that the early
run starts from Debian's packages on three hosts of this machine (tests/hosts.py: each its own address, home, /tmp and
processes): a controller, where jobs are submitted, and two compute nodes, each with its own munged (one key, as a
cluster distributes it) and slurmd; slurm.conf and the key on a folder every host mounts, as configuration
management would put them, and one shared folder for the jobs' output and checkpoints. Jobs get what they ask for
and no more (select/cons_tres, CR_CPU). `python -m pytest -m slurm` runs these alone; `.ci/run` installs slurm-wlm
and munge where they are missing."""
import contextlib
import getpass
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SMOKE
from early import takes
from hosts import PATH, can_make_hosts, hosts
from processes import kill_tree

pytestmark = pytest.mark.slurm
CONTROLLER, NODES = "ctl", ("n1", "n2")
CPUS = 2  # per node, each given to a job as it asks for it (select/cons_tres, CR_CPU), as on most clusters
DAEMON_START_S, JOB_TIMEOUT_S = 60, 240
# A job whose head cannot start ends within this (Ray gives up on its GCS after about 40 s; the batch script looks at
# its job steps every 2 s), long before its own START_TIMEOUT_S of 300 s.
DEAD_HEAD_S = 150
DDP, RAY = "01-vanilla-pytorch-ddp/slurm_ddp.sbatch", "02-ray-train-ddp/slurm_ray.sbatch"
SLURM, SHARED = "/mnt/slurm", "/mnt/shared"  # on every host: slurm.conf and munge's key; the jobs' storage
MUNGE = "/tmp/munge.socket"  # each host's own munged, in its own /tmp
ENV = {"SLURM_CONF": f"{SLURM}/slurm.conf", "PATH": PATH}


def have_slurm() -> bool:
    return all(shutil.which(tool) for tool in ("mungekey", "munged", "slurmctld", "slurmd", "sbatch", "scontrol"))


runs_here = pytest.mark.skipif(not have_slurm() or not can_make_hosts(), reason="needs SLURM and munge (apt-get "
                               "install slurm-wlm munge) and root (tests/hosts.py: network, mount and PID namespaces)")


def configuration(addresses: dict[str, str]) -> str:
    """slurm.conf for the controller and NODES, by their hosts' addresses, on their default ports (each host has its
    own): no accounting, no cgroups. Its job ids start anywhere, as a cluster's do after its first jobs (the jobs'
    ports derive from them)."""
    nodes = "\n".join(f"NodeName={node} NodeAddr={addresses[node]} CPUs={CPUS} RealMemory=12000 State=UNKNOWN"
                      for node in NODES)
    return f"""ClusterName=workshop
SlurmctldHost={CONTROLLER}({addresses[CONTROLLER]})
SlurmUser={getpass.getuser()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={MUNGE}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
StateSaveLocation=/tmp/slurmctld
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile=/tmp/slurmctld.pid
SlurmdPidFile=/tmp/slurmd.pid
SlurmctldLogFile={SLURM}/log/slurmctld.log
SlurmdLogFile={SLURM}/log/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
FirstJobId={random.randrange(1000, 100000)}
KillWait=10
MinJobAge=5
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def slurm_cluster(folder: Path, lane):
    """The hosts, each with munged, then slurmctld on the controller and slurmd on each node, in the foreground
    (this run's processes); yields the hosts. Cancels every job at the end, and fails if a job left a process on a
    node (the hosts then go down, and all with them)."""
    slurm, shared = folder / "slurm", folder / "shared"
    (slurm / "log").mkdir(parents=True)
    shared.mkdir()
    subprocess.run(["mungekey", "--create", "--keyfile", str(slurm / "munge.key")], check=True, timeout=30)
    with hosts(folder, [CONTROLLER, *NODES], shared={SLURM: slurm, SHARED: shared}) as cluster:
        (slurm / "slurm.conf").write_text(configuration({name: host.address for name, host in cluster.items()}))
        munged = f"munged --force --key-file {SLURM}/munge.key --socket {MUNGE} --pid-file /tmp/munged.pid " \
                 f"--seed-file /tmp/munged.seed --log-file {SLURM}/log/munged-$(hostname).log"
        for name, host in cluster.items():
            daemon = "slurmctld -D -i" if name == CONTROLLER else "slurmd -D"
            script = f"mkdir /tmp/slurmd /tmp/slurmctld\n{munged}\n" \
                     f"timeout {DAEMON_START_S} bash -c 'until [ -S {MUNGE} ]; do sleep 0.1; done'\nexec {daemon}"
            lane.start(host.command(script), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        assert within(DAEMON_START_S, lambda: sinfo(cluster) == f"idle {len(NODES)}"), \
            f"sinfo shows {sinfo(cluster)!r}, not {len(NODES)} idle nodes, {DAEMON_START_S} s after slurmd " \
            f"started{log_tails(slurm)}"
        try:
            yield cluster
        finally:
            on(cluster, "scancel --full --user $(id -un)")
            within(30, lambda: not on(cluster, "squeue --noheader").stdout.strip())
            # What is left on a node besides its daemons: a job's process reparented to the host's PID 1.
            left = {node: on(cluster, "ps --ppid 1 --no-headers -o args | grep -v '^munged' || true", node).stdout
                    for node in NODES}
    assert not any(left.values()), f"processes of the jobs left running: {left}"


def log_tails(slurm: Path, lines: int = 15) -> str:
    """The last lines of each daemon's log: why a node did not come up."""
    return "".join(f"\n--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                   for log in sorted((slurm / "log").glob("*.log")))


def on(cluster: dict, command: str, host: str = CONTROLLER, timeout: float = 30) -> subprocess.CompletedProcess:
    """command run on a host of the cluster (the controller: where users submit), from the repository."""
    return subprocess.run(cluster[host].command(f"cd {ROOT}\n{command}"), env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def sinfo(cluster: dict) -> str:
    return on(cluster, "sinfo --noheader --format '%T %D'").stdout.strip()


def within(seconds: float, condition) -> bool:
    """Whether condition() came true within these seconds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def sbatch(cluster: dict, folder: Path, lane, name: str, *words: str, env: str = ""):
    """sbatch --wait WORDS (sbatch's options, the script, its flags), from the controller host, its output in the
    shared folder as NAME.out: the process, whose exit code is the job's, and what sbatch says in folder/NAME.sbatch."""
    command = shlex.join(["sbatch", "--wait", "--output", f"{SHARED}/{name}.out", *words])
    with (folder / f"{name}.sbatch").open("w") as said:
        return lane.start(cluster[CONTROLLER].command(f"cd {ROOT}\n{env}{command}"), env=ENV, stdout=said,
                          stderr=subprocess.STDOUT)


def outcome(process: subprocess.Popen, folder: Path, name: str, timeout: float = JOB_TIMEOUT_S) -> dict:
    """The job's exit code (None: still running after timeout s, sbatch then stopped), what sbatch printed and
    what the job printed."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    if process.poll() is None:
        kill_tree(process.pid)
    output = folder / "shared" / f"{name}.out"
    return dict(returncode=process.poll(), sbatch=(folder / f"{name}.sbatch").read_text(),
                output=output.read_text() if output.exists() else "(no output)")


def both_running(cluster: dict, jobs: int) -> bool:
    return len(on(cluster, "squeue --noheader --states RUNNING --format %i").stdout.split()) == jobs


@takes(300)  # 256 s alone (Intel Xeon, 2 cores, 2026-12-04): four jobs, two of them at once, and a dead head
def slurm_jobs(folder: Path, lane) -> dict:
    """The cluster; step 01's job, then step 02's, each with both CPUs of both nodes; then two of step 02's jobs at
    once on the same nodes (a CPU of each node each); then step 02's job with the port of its head held by another
    program on the first node. {name: its outcome}."""
    ddp = SMOKE + ["--epochs", "1"]
    ray = SMOKE + ["--epochs", "1", "--steps-per-epoch", "2"]
    done = {}
    with slurm_cluster(folder, lane) as cluster:
        def submit(name: str, *words: str, env: str = "") -> subprocess.Popen:
            return sbatch(cluster, folder, lane, name, *words, env=env)

        done["ddp"] = outcome(submit("ddp", DDP, "--", *ddp, "--checkpoint-dir", f"{SHARED}/ddp"), folder, "ddp")
        done["ray"] = outcome(submit("ray", RAY, *ray, "--checkpoint-dir", f"{SHARED}/ray"), folder, "ray")
        jobs = {name: submit(name, "--cpus-per-task", "1", RAY, *ray, "--checkpoint-dir", f"{SHARED}/{name}")
                for name in ("ray-a", "ray-b")}
        # Both running at once, seen before either ended
        done["at_once"] = within(JOB_TIMEOUT_S, lambda: both_running(cluster, 2) or any(
            job.poll() is not None for job in jobs.values())) and all(job.poll() is None for job in jobs.values())
        done |= {name: outcome(job, folder, name) for name, job in jobs.items()}
        port = random.randrange(20000, 30000)
        holder = f"{sys.executable} -c 'import socket, time; s = socket.socket(); s.bind((\"\", {port})); " \
                 "s.listen(); time.sleep(3600)'"
        holding = on(cluster, f"nohup {holder} > /dev/null 2>&1 & echo $!", NODES[0]).stdout.strip()
        done["dead_head"] = outcome(submit("dead_head", RAY, *ray, env=f"export HEAD_PORT={port}\n"), folder,
                                    "dead_head", timeout=DEAD_HEAD_S)
        done["dead_head"]["port"] = port
        on(cluster, f"kill {holding}", NODES[0])
    return done


def job(early_run, name: str) -> str:
    outcome = early_run[name]
    assert outcome["returncode"] == 0, f"{outcome['sbatch']}\n{outcome['output'][-3000:]}"
    return outcome["output"]


@runs_here
@pytest.mark.early(run=slurm_jobs)
def test_the_ddp_job_runs_a_launcher_per_node_in_one_process_group(early_run):
    """One launcher per node, one process each (CPU nodes): a world of 2 is both nodes' launchers in one rendezvous,
    at the first node's address (the job's own, whatever the node is called)."""
    output = job(early_run, "ddp")
    assert '{"step": "ddp", "world_size": 2, ' in output and output.count("epoch 1/1 | 2 processes") == 1
    assert f"{len(NODES)} nodes, CPUs per node: {CPUS}(x{len(NODES)})" in output  # what sbatch asked for


@runs_here
@pytest.mark.early(run=slurm_jobs)
def test_the_ray_job_starts_a_ray_node_per_slurm_node_and_trains_on_both(early_run):
    """A Ray head on the first SLURM node, a node joining it from the second (with the job's token, from its
    environment: each host's home is its own and holds none), each Ray node with its own node's CPUs: step 02's two
    workers fit on one (Ray Train packs them), where with a CPU a node they took both."""
    output = job(early_run, "ray")
    assert f"{len(NODES)} nodes, CPUs per node: {CPUS}(x{len(NODES)})" in output
    assert "| 2 x cpu on 1 node(s)," in output and '{"step": "ray_ddp", "world_size": 2, ' in output


@runs_here
@pytest.mark.early(run=slurm_jobs)
def test_two_ray_jobs_at_once_on_the_same_nodes_both_finish(early_run):
    """Two of step 02's jobs, a CPU of each node each, running at the same time: each its own Ray cluster on both
    nodes, its head's ports and Ray's folders from its own job id, no node of one joining the other's."""
    assert early_run["at_once"], "the two jobs never ran at the same time"
    heads = set()
    for name in ("ray-a", "ray-b"):
        output = job(early_run, name)
        assert f"{len(NODES)} nodes, CPUs per node: 1(x{len(NODES)})" in output
        assert "| 2 x cpu on 2 node(s)," in output and '{"step": "ray_ddp", "world_size": 2, ' in output, output
        heads |= {line.split("Ray head at ")[1].split(",")[0] for line in output.splitlines() if "Ray head at" in line}
    assert len(heads) == 2, heads


@runs_here
@pytest.mark.early(run=slurm_jobs)
def test_a_ray_job_whose_head_cannot_start_ends_with_one_line_long_before_its_deadline(early_run):
    """The head's port held by another program on the first node: the head's job step ends, and the batch script,
    which looks at its steps while it waits, ends with one line within DEAD_HEAD_S."""
    outcome = early_run["dead_head"]
    detail = f"{outcome['sbatch']}\n{outcome['output'][-3000:]}"
    assert outcome["returncode"] is not None, f"still waiting after {DEAD_HEAD_S} s\n{detail}"
    assert outcome["returncode"] != 0, detail
    errors = [line for line in outcome["output"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: a Ray node's job step ended while waiting for the Ray "
                                                     "head at ") and errors[0].endswith(f":{outcome['port']}"), detail
