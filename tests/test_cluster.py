"""README's "Running on a cluster", run as written: Ray 2.60's token, a head and a second node started by hand, a step
on both, `ray stop`. On one machine, in a network and process namespace of its own (`unshare`): its own loopback, so
the default port 6379 is free and no other Ray of the suite is reachable, and `ray stop` stops only these nodes."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SMOKE
from early import takes

COMMAND_TIMEOUT_S = 120  # each command of the script; the whole of it below
HEAD = "127.0.0.1:6379"


def readme_cluster_commands() -> list:
    section = (ROOT / "README.md").read_text().split("## Running on a cluster")[1].split("\n## ")[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [" ".join(line.split("  #")[0].split()) for line in block.splitlines() if line.strip()]


def can_isolate() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
        timeout=30).returncode == 0


@takes(130)  # 99 s as a test of its own in the full suite (AMD EPYC Zen 5, 2026-11-28)
def two_ray_nodes_by_hand(folder: Path, lane) -> dict:
    """README's cluster commands as written, in a network and process namespace of its own: the token, a head and a
    node that joins it (one CPU each, so that the step's two workers need both), a node and a step without the
    token (refused), the step with it, `ray stop`. An early run: most of it is Ray starting. Each command's output
    by its name, and the script's own."""
    export, generate, head, join, step = readme_cluster_commands()
    assert (export, generate, head, join) == ("export RAY_AUTH_MODE=token", "ray get-auth-token --generate",
                                              "ray start --head --port=6379", "ray start --address=HEAD_IP:6379")
    assert step.startswith("python 02-ray-train-ddp/train_ray_ddp.py --address HEAD_IP:6379 ")
    join = join.replace("HEAD_IP:6379", HEAD) + " --num-cpus 1"
    step = f"{sys.executable} 02-ray-train-ddp/train_ray_ddp.py --address {HEAD} --num-workers 2 " \
           f"{' '.join(SMOKE)} --epochs 1 --checkpoint-dir {folder / 'checkpoints'}"
    logs = folder / "logs"
    logs.mkdir()

    def each(name: str, command: str) -> str:
        return f"timeout {COMMAND_TIMEOUT_S} {command} > {logs / name}.out 2> {logs / name}.err"

    script = "\n".join([
        "set -e", "ip link set lo up", f"export HOME={folder / 'home'} PATH={Path(sys.executable).parent}:$PATH",
        f"cd {ROOT}", export, each("generate", generate), each("head", head + " --num-cpus 1"),
        # Without the token: a node, then a step, refused.
        f"if {each('node_without', 'env -u RAY_AUTH_MODE ' + join)}; then exit 11; fi",
        each("join", join),
        f"if {each('step_without', 'env -u RAY_AUTH_MODE ' + step)}; then exit 12; fi",
        each("step", step), each("stop", "ray stop"),
        # Ray's processes by name (the raylet, the GCS, the workers: ray::...), not this script's own command line.
        "echo left: $(( $(pgrep -c '^(raylet|gcs_server)$' || true) + $(pgrep -c -f '^ray::' || true) ))"])
    done = lane.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
                    timeout=COMMAND_TIMEOUT_S * 3)
    return dict(done=done, output={p.name: p.read_text() for p in logs.iterdir()})


@pytest.mark.skipif(not can_isolate(), reason="needs unshare with network and process namespaces (root)")
@pytest.mark.early(run=two_ray_nodes_by_hand)
def test_readmes_two_ray_nodes_by_hand_train_step_02_on_both_and_refuse_whoever_lacks_the_token(early_run):
    done, output = early_run["done"], early_run["output"]
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}\n" + "\n".join(
        f"--- {name}\n{text[-1500:]}" for name, text in sorted(output.items()))
    assert done.stdout.strip() == "left: 0"  # ray stop stopped both nodes
    assert "InvalidAuthToken" in output["node_without.err"]
    refused = [line for line in output["step_without.err"].splitlines() if line.startswith("error:")]
    assert len(refused) == 1 and refused[0].startswith(f"error: the Ray cluster at --address {HEAD} refused this "
                                                       "driver (Failed to connect to Ray cluster at ")
    assert refused[0].endswith("if its head uses token authentication, set RAY_AUTH_MODE=token here and copy the "
                               "head's ~/.ray/auth_token to this machine's ~/.ray/ (README: Running on a cluster)")
    assert "Traceback" not in output["step_without.err"]
    assert "| 2 x cpu on 2 node(s)," in output["step.out"]  # the two workers, one on each node
    assert output["step.out"].splitlines()[-1].startswith('{"step": "ray_ddp", "world_size": 2')
