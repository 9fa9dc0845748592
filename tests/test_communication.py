"""What one optimizer step puts into collectives, counted on 2 gloo processes of `tiny`: DDP all-reduces every
gradient once; FSDP2, sharded by step 04's own shard_model, all-gathers every weight in forward, the blocks' again in
backward (the root stays gathered), and reduce-scatters every gradient. Step 04's README states the bytes per step
for `hybrid` from these counts and the ring algorithms' factors; the test holds its table to them."""
import math
import re
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from benchmarks.ranks import spawned_ranks
from common.model import TRANSFORMER_BLOCK, build_model, count_params
from checks import load_script
from conftest import ROOT
from common.rendezvous import free_port

WORLD_SIZE = 2
TIMEOUT_S = 60  # the collectives' deadline, and each process's


def one_step(rank: int, strategy: str, port: int) -> dict:
    """A process of the pair: one optimizer step of `tiny`, counting the bytes handed to each kind of collective."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=timedelta(seconds=TIMEOUT_S))
    sent = Counter()
    torch.manual_seed(0)
    model = build_model("tiny")
    if strategy == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        model = torch.nn.parallel.DistributedDataParallel(model)

        def counted_allreduce(state, bucket):
            sent["all_reduce"] += bucket.buffer().nbytes
            return allreduce_hook(state, bucket)
        model.register_comm_hook(dist.group.WORLD, counted_allreduce)
    else:
        gather, scatter = dist.all_gather_single, dist.reduce_scatter_single

        def all_gather_single(output, input, *args, **kwargs):
            sent["all_gather"] += output.nbytes  # the whole of what is gathered
            return gather(output, input, *args, **kwargs)

        def reduce_scatter_single(output, input, *args, **kwargs):
            sent["reduce_scatter"] += input.nbytes  # the whole of what is reduced
            return scatter(output, input, *args, **kwargs)
        dist.all_gather_single, dist.reduce_scatter_single = all_gather_single, reduce_scatter_single
        step04 = load_script("04-ray-train-fsdp2/train_ray_fsdp2.py")
        flags = SimpleNamespace(mixed_precision=False, cpu_offload=False, reshard_after_forward=True,  # the defaults
                                activation_checkpointing=False)
        step04.shard_model(model, flags, torch.device("cpu"))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    dist.destroy_process_group()
    return dict(sent)


def counted(strategy: str) -> dict:
    counts = spawned_ranks(one_step, WORLD_SIZE, strategy, free_port(), timeout_s=2 * TIMEOUT_S)
    assert counts[0] == counts[1], "both ranks send the same"
    return counts[0]


def test_ddp_all_reduces_every_gradient_once_per_step():
    assert counted("ddp") == {"all_reduce": 4 * count_params(build_model("tiny"))}


def fsdp2_bytes(model, world_size: int) -> tuple:
    """The fp32 bytes of the whole model and of its blocks as FSDP2 holds them: each parameter split evenly on dim 0,
    padded to a multiple of the number of ranks (tiny's class token and position embedding, 1 row each)."""
    def padded(p):
        return math.ceil(p.shape[0] / world_size) * world_size * p[0].numel() * p.element_size()
    blocks = [m for m in model.modules() if isinstance(m, TRANSFORMER_BLOCK)]
    return sum(map(padded, model.parameters())), sum(padded(p) for m in blocks for p in m.parameters())


def test_fsdp2_gathers_the_weights_twice_but_the_roots_and_reduce_scatters_every_gradient():
    whole, blocks = fsdp2_bytes(build_model("tiny"), WORLD_SIZE)
    assert counted("fsdp2") == {"all_gather": whole + blocks, "reduce_scatter": whole}


def per_step_megabytes(preset: str, world_size: int) -> dict:
    """What each rank sends per optimizer step, fp32, from the counts above and the ring algorithms: an all-reduce
    sends 2 (N-1)/N of its buffer, an all-gather or a reduce-scatter (N-1)/N. gloo has no reduce-scatter: FSDP on
    CPUs all-reduces the gradients and keeps its slice."""
    model = build_model(preset)
    share = (world_size - 1) / world_size
    whole, blocks = fsdp2_bytes(model, world_size)
    return dict(ddp=2 * share * 4 * count_params(model) / 1e6, fsdp=share * (2 * whole + blocks) / 1e6,
                gloo_fsdp=share * (3 * whole + blocks) / 1e6)


# The textbook's shares that step 04's README quotes: per parameter on N ranks, DDP sends 2 (N-1)/N of its bytes (an
# all-reduce: towards 2x), FSDP 3 (N-1)/N (two all-gathers and a reduce-scatter: towards 3x), 1.5 times DDP's.
TEXTBOOK = dict(ddp=2, fsdp=3, ratio=1.5)


def test_the_textbook_shares_follow_from_the_ring_algorithms():
    for world_size in (2, 8, 4096):
        share = (world_size - 1) / world_size
        assert (3 * share) / (2 * share) == TEXTBOOK["ratio"]
    assert 2 * 4095 / 4096 == pytest.approx(TEXTBOOK["ddp"], rel=1e-3)
    assert 3 * 4095 / 4096 == pytest.approx(TEXTBOOK["fsdp"], rel=1e-3)


def test_step_04s_readme_states_the_bytes_per_step_these_counts_give():
    readme = (ROOT / "04-ray-train-fsdp2" / "README.md").read_text()
    stated = re.search(r"<!-- communication -->\n(.*?)<!-- /communication -->", readme, re.S).group(1)
    mb = per_step_megabytes("hybrid", 2)
    assert f"| DDP | all-reduce of every gradient | {mb['ddp']:.1f} MB |" in stated
    assert f"| FSDP (NCCL) | all-gather twice, reduce-scatter once | {mb['fsdp']:.1f} MB " \
           f"({mb['fsdp'] / mb['ddp']:.2f}x) |" in stated
    assert f"| FSDP (gloo: reduce-scatter as all-reduce) | | {mb['gloo_fsdp']:.1f} MB " \
           f"({mb['gloo_fsdp'] / mb['ddp']:.2f}x) |" in stated
