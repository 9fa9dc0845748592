"""What a run reports of itself, on every rank: its epoch line, each rank's peak memory and node (gathered from the
ranks), and the memory table printed at a run's end. The Ray steps' progress bar is common/ray_setup.py's (it draws
through Ray's driver)."""
import resource
import socket
import sys

import torch
import torch.distributed as dist


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: allocated GPU memory on CUDA, resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / maxrss_units_per_mb(sys.platform)


def maxrss_units_per_mb(platform: str) -> int:
    """ru_maxrss is in kilobytes on Linux, in bytes on macOS."""
    return 2**20 if platform == "darwin" else 1024


def gather_from_ranks(value) -> list:
    """Every rank's value, in rank order; a list of one in a single process."""
    if not dist.is_initialized():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def this_node() -> str:
    """Which machine this process runs on: Ray's node id in a Ray worker (the tests' two Ray nodes share one host),
    the host name elsewhere (torchrun, Ray Train's local mode)."""
    ray = sys.modules.get("ray")  # imported by the Ray steps only
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return socket.gethostname()


def memory_table(memory_per_rank: list) -> str:
    """The per-rank memory report the Ray steps print at the end of a run."""
    lines = ["memory per rank (MB) | parameters | gradients | optimizer state | peak"]
    for rank, m in enumerate(memory_per_rank):
        lines.append(f"rank {rank:<15} | {m['params_mb']:>10,.1f} | {m['grads_mb']:>9,.1f} | "
                     f"{m['optimizer_mb']:>15,.1f} | {m['peak_mb']:,.0f}")
    return "\n".join(lines)


def epoch_line(record: dict, epochs: int, peak_mb: float) -> str:
    """One epoch of the history, as rank 0 prints it, with how many processes trained it (torchrun's processes or
    Ray's workers), which an elastic run (step 04, --num-workers MIN-MAX) changes as it resizes."""
    noun = "process" if record["world_size"] == 1 else "processes"
    return (f"epoch {record['epoch']}/{epochs} | {record['world_size']} {noun} | "
            f"train loss {record['train_loss']:.4f} | test acc {record['test_accuracy']:.2%} | "
            f"{record['epoch_time_s']:.1f} s | {record['images_per_s']:,.0f} img/s | peak mem {peak_mb:,.0f} MB")
