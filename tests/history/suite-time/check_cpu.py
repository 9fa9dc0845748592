"""Wall time and the machine's busy core-seconds of one lab's check, run N times on a fresh two-node cluster of 1 CPU
per node, as the suite runs the Ray labs' checks, with Ray's defaults as an attendee has them (the suite also turns
off the preemption watcher, tests/conftest.py): the numbers of the archive README's sections on the checks' cost.

    # from the repository's root, nothing else running; the first check makes the reference runs (labs.harness)
    LABS_CACHE=/tmp/labs-cache python tests/history/suite-time/check_cpu.py 3 02 FILE

Busy core-seconds are the whole machine's (/proc/stat), so the numbers hold only on an otherwise quiet machine."""
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
from benchmarks.ray_overhead import TICKS, machine_ticks  # noqa: E402


def busy() -> float:
    """The machine's busy core-seconds since boot."""
    return machine_ticks() / TICKS


def main(times: int, lab: str, file: str) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        for i in range(times):
            start, used = time.monotonic(), busy()
            check = subprocess.run([sys.executable, "-m", "labs.check", lab, "--file", file, "--address",
                                    cluster.address], cwd=ROOT, capture_output=True, text=True, timeout=600)
            print(f"check {i}: exit code {check.returncode}, {time.monotonic() - start:.1f} s, "
                  f"{busy() - used:.1f} busy core-s", flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
