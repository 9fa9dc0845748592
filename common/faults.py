"""The crash drill (--fail-at-epoch): one rank or worker dies after an epoch's checkpoint, and the run resumes."""
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from .ray_internals import POLL_INTERVAL


def crash_one_rank(epoch: int, checkpoint_path: Path) -> None:
    """--fail-at-epoch, in one process or under torchrun: once rank 0 has written the epoch's checkpoint, the last
    rank exits (and torchrun stops the others)."""
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if dist.is_initialized():
        dist.barrier()  # let rank 0 finish writing the checkpoint
    if rank == world_size - 1:
        sys.exit(f"simulated crash of rank {rank} after epoch {epoch + 1} (--fail-at-epoch); "
                 f"rerun with --resume to continue from {checkpoint_path}")


def crash_one_worker(rank: int, world_size: int) -> None:
    """--fail-at-epoch: the last worker dies hard (not an exception, which a real crash rarely is), once Ray has
    registered the checkpoint just reported: its controller does when it next polls the workers, so crash well
    after that, or Ray restarts from the checkpoint before."""
    if rank == world_size - 1:
        time.sleep(5 * float(os.environ[POLL_INTERVAL]))
        os._exit(1)
