"""Ranks of a gloo group in new interpreters, for the benchmarks and the tests that measure a few ranks at once."""
import tempfile
import time
from pathlib import Path


def spawned_ranks(function, world_size: int, *args, timeout_s: float) -> list:
    """function(rank, *args) in world_size new interpreters at once (torch.multiprocessing's spawn): what each
    returned, in rank order (torch.save'd: tensors too); TimeoutError past timeout_s, the ranks killed. Never
    forked: a fork of a process that is a Ray driver (the test suite's) cuts that driver off from Ray's actors
    (tests/suite_rules.py)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        ranks = mp.start_processes(saved_return, args=(function, folder, args), nprocs=world_size, join=False,
                                   start_method="spawn")
        deadline = time.monotonic() + timeout_s
        while not ranks.join(timeout=max(0.0, deadline - time.monotonic())):  # True once all have exited, cleanly
            if time.monotonic() > deadline:
                for rank in ranks.processes:
                    rank.kill()
                raise TimeoutError(f"the {world_size} ranks of {function.__name__} did not finish in {timeout_s:g} s")
        return [load(Path(folder, f"{rank}.pt")) for rank in range(world_size)]


def saved_return(rank: int, function, folder: str, args: tuple) -> None:
    import torch
    torch.save(function(rank, *args), Path(folder, f"{rank}.pt"))


def load(path: Path):
    import torch
    return torch.load(path, weights_only=False)
