"""One rank of a mismatched pair, for tests/test_hang_tools.py: python tests/mismatch.py KIND, started with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), collectives timing out after TIMEOUT_S
(default 3) seconds.

KIND: "skipped" (rank 0 all-reduces a metric that rank 1 never reduces; rank 1 goes on to a barrier), "shape"
(the ranks all-reduce tensors of 3 and 4 values), "late" (rank 1 is still in the skipped all-reduce when rank 0
calls monitored_barrier). Each rank prints "rank R waits" before its first mismatched collective and, with
TORCH_FR_BUFFER_SIZE set, saves its Flight Recorder buffer to FR_DIR/rank_R when a collective fails."""
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=float(os.environ.get("TIMEOUT_S", 3)))


def main(kind: str) -> None:
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(2))  # one collective that matches, as a training step's would
    print(f"rank {rank} waits", flush=True)
    try:
        if kind == "skipped":
            if rank == 0:
                dist.all_reduce(torch.ones(3))  # the metric, reduced inside `if rank == 0`
            dist.barrier()
        elif kind == "shape":
            dist.all_reduce(torch.ones(3 + rank))
        elif kind == "late":
            if rank == 1:
                dist.all_reduce(torch.ones(3))
            dist.monitored_barrier(timeout=TIMEOUT)
    except RuntimeError:
        if os.environ.get("TORCH_FR_BUFFER_SIZE"):
            save_flight_record(rank)
        raise
    finally:
        time.sleep(0.5)  # the other rank gets its own error (DETAIL's mismatch), not this one's leaving
    dist.destroy_process_group()


def save_flight_record(rank: int) -> None:
    """What the Flight Recorder holds, as NCCL's watchdog dumps it on a timeout (gloo has no such watchdog)."""
    from torch._C._distributed_c10d import _dump_fr_trace

    Path(os.environ["FR_DIR"], f"rank_{rank}").write_bytes(_dump_fr_trace())


if __name__ == "__main__":
    main(sys.argv[1])
