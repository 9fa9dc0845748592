"""Step 07: tensor parallelism on CPU with gloo. On 2 ranks one step computes what one process computes, with the
all-reduces its README derives, activation checkpointing changing no bit; a Ray run resumes on another mesh and ends
with DDP's weights; its model.pt is build_model's."""
import argparse
import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from benchmarks.ranks import spawned_ranks
from benchmarks.steps import step
from checks import (assert_same_weights, assert_sane_summary, checkpoint_weights, collectives_per_step, final_json,
                    latest_ray_checkpoint, load_script, profile_summary, ray_checkpoints, resumed_after)
from common.data import load_data
from common.model import TRANSFORMER_BLOCK, build_model, split_attention
from common.rendezvous import free_port
from common.training import evaluate
from conftest import ACCUMULATE, EVAL_IMAGES, PROFILE, ROOT, ROUNDING, ray_script
from labs.checks.tp_plan import CountAllReduces  # DTensor's collectives, by kind (lab 07's check counts so)
from labs.reference import TOLERANCE, relative_difference
from suite_rules import time_limit
from test_communication import per_step_megabytes

RAY_TP = step("ray_tp").script
TIMEOUT_S = 60  # the collectives' deadline, and each process's
BLOCKS = len(build_model("tiny").encoder.layers)


@pytest.fixture(scope="module")
@time_limit(420)  # two Ray runs, each limited to run()'s 180 s
def tp_run(ray_cluster, tmp_path_factory):
    """One step-07 run that changes its mesh: epoch 1 on 2 workers as 2 dp groups of 1 (--tp 1: FSDP2 alone), which
    crashes with no restart left; --resume finishes it as 1 TP group of 2, loading epoch 1's checkpoint onto the
    other mesh; profiled there."""
    storage = tmp_path_factory.mktemp("tp")
    crashed = ray_script(RAY_TP, ray_cluster, storage, *ACCUMULATE, "--tp", "1", "--fail-at-epoch", "1",
                         "--max-failures", "0")
    assert crashed.returncode != 0, crashed.stderr[-3000:]
    result = ray_script(RAY_TP, ray_cluster, storage, *ACCUMULATE, *PROFILE, "--resume", "--tp", "2")
    return final_json(result), storage, result


def exported_model(storage) -> torch.nn.Module:
    model = build_model("tiny")
    model.load_state_dict(torch.load(latest_ray_checkpoint(storage) / "model.pt", weights_only=True))  # strict
    return model


def test_tp_trains_and_resumes_on_another_mesh(tp_run):
    summary, storage, result = tp_run
    assert_sane_summary(summary, "ray_tp", world_size=2, resumed=True)
    assert resumed_after(result.stdout) == [1] and "epoch 2/2 | 2 processes |" in result.stdout
    assert "memory per rank (MB)" in result.stdout
    # Each rank's DCP shard (epoch 1: FSDP2's halves; epoch 2: TP's), DCP's index, Ray's metadata, model.pt last.
    assert {p.name for p in ray_checkpoints(storage)[0].iterdir()} == {"__0_0.distcp", "__1_0.distcp", ".metadata",
                                                                       ".metadata.json"}
    assert {p.name for p in latest_ray_checkpoint(storage).iterdir()} == {"__0_0.distcp", "__1_0.distcp",
                                                                          ".metadata", ".metadata.json", "model.pt"}


def test_tp_holds_the_blocks_matrices_once_between_its_ranks(tp_run):
    """Each rank holds half of every split Linear (the column-wise ones' weights and biases, the row-wise ones'
    weights) and all the rest: the stem, embeddings, norms, head and the row-wise layers' biases."""
    model = split_attention(build_model("tiny"))
    blocks = [m for m in model.modules() if isinstance(m, TRANSFORMER_BLOCK)]
    column_wise = [b.get_submodule(n) for b in blocks for n in ("self_attention.q", "self_attention.k",
                                                                "self_attention.v", "mlp.0")]
    row_wise = [b.get_submodule(n) for b in blocks for n in ("self_attention.out_proj", "mlp.3")]
    split = sum(m.weight.numel() + m.bias.numel() for m in column_wise) + sum(m.weight.numel() for m in row_wise)
    whole = sum(p.numel() for p in model.parameters()) - split
    memory = tp_run[0]["memory_per_rank"]
    for rank in memory:
        assert rank["params_mb"] == pytest.approx((split / 2 + whole) * 4 / 2**20, abs=0.051)  # printed to 0.1 MB


def test_tp_all_reduces_twice_forward_and_four_times_backward_per_block(tp_run):
    """The profiler's count, per optimizer step of 2 micro-batches on 1 TP group of 2: each block's 2 row-wise layers
    sum their ranks' shares in forward (1 all-reduce each), and each of its 4 column-wise layers (q, k, v, mlp.0) sums
    its input's gradient in backward. FSDP2 over a dp dimension of 1 gathers nothing."""
    counts = collectives_per_step(profile_summary(tp_run[1]))
    assert len(counts) == 2
    for calls in counts:
        assert calls.get("all_reduce") == 2 * BLOCKS * (2 + 4), calls


def test_tp_ends_with_ddps_weights(tp_run, ray_run):
    """The same global batches and seed as step 02's run: the same weights up to rounding (conftest's ROUNDING),
    through a change of mesh."""
    ddp_weights = checkpoint_weights(latest_ray_checkpoint(ray_run[1]))
    assert_same_weights(ddp_weights, exported_model(tp_run[1]).state_dict(), atol=ROUNDING)


def test_exported_model_reproduces_the_tp_runs_accuracy_on_one_device(tp_run):
    data = load_data("synthetic", "", EVAL_IMAGES)
    correct, counted = evaluate(exported_model(tp_run[1]), data.test_images, data.test_labels,
                                torch.device("cpu")).tolist()
    assert counted == EVAL_IMAGES and correct / counted == tp_run[0]["test_accuracy"]


def tiny_in_float64() -> torch.nn.Module:
    """tiny with step 07's attention, in double precision: 2 ranks and 1 process sum their products in other
    orders, which float64 leaves near 1e-15 on any processor (labs/reference.py), far inside TOLERANCE."""
    torch.manual_seed(0)
    model = split_attention(build_model("tiny")).double()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision's zeros would send the blocks no gradient
    return model


def one_step(model, share=slice(None)) -> tuple[float, dict, CountAllReduces]:
    """The loss on this share of the batch, every parameter's gradient whole, and the collectives of forward and
    backward."""
    torch.manual_seed(1)
    images, labels = torch.randn(8, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (8,))
    with CountAllReduces() as collectives:
        loss = torch.nn.functional.cross_entropy(model(images[share]), labels[share])
        loss.backward()
    grads = {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
             for name, p in model.named_parameters()}
    return loss.item(), grads, collectives


def tp_rank(rank: int, port: int) -> dict:
    """A rank of 1 TP group of 2: step 07's parallelize, one step, without and with activation checkpointing."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    step07 = load_script(RAY_TP)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    out = {}
    for checkpointed in (False, True):
        model = tiny_in_float64()
        flags = argparse.Namespace(mixed_precision=False, cpu_offload=False, reshard_after_forward=True,
                                   activation_checkpointing=checkpointed)
        step07.parallelize(model, mesh, flags)
        loss, grads, collectives = one_step(model)
        out[checkpointed] = dict(loss=loss, grads=grads, collectives=dict(collectives.counts),
                                 bytes=dict(collectives.bytes))
    dist.destroy_process_group()
    return out


def grid_rank(rank: int, port: int) -> dict:
    """A rank of 4 as 2 x 2 (dp x tp): step 07's parallelize (TP in each row, FSDP2 down each column), one step on
    its dp group's half of the batch."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4,
                            timeout=timedelta(seconds=TIMEOUT_S))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = tiny_in_float64()
    load_script(RAY_TP).parallelize(model, mesh, argparse.Namespace(
        mixed_precision=False, cpu_offload=False, reshard_after_forward=True, activation_checkpointing=False))
    half = mesh["dp"].get_local_rank()
    loss, grads, collectives = one_step(model, slice(4 * half, 4 * half + 4))
    dist.destroy_process_group()
    return dict(loss=loss, grads=grads, collectives=dict(collectives.counts))


@pytest.fixture(scope="module")
def tp_pair() -> dict:
    """{(rank, checkpointed): its step}"""
    ranks = spawned_ranks(tp_rank, 2, free_port(), timeout_s=2 * TIMEOUT_S)
    return {(rank, checkpointed): step for rank, steps in enumerate(ranks) for checkpointed, step in steps.items()}


def assert_one_processs_gradients(ours: dict, grads: dict) -> None:
    assert ours.keys() == grads.keys()
    assert relative_difference(ours, grads) < TOLERANCE
    # Each one too, the smallest included, but the key biases': their true gradient is 0 (softmax ignores a
    # shift of every logit of a query), what they receive is rounding noise (checks.assert_same_weights).
    for name, grad in grads.items():
        if name.endswith("self_attention.k.bias"):
            assert grad.abs().max() < 1e-15 and ours[name].abs().max() < 1e-15, name
            continue
        assert relative_difference({name: ours[name]}, {name: grad}) < TOLERANCE, name


def test_tp_on_2_ranks_computes_what_one_process_computes(tp_pair):
    loss, grads, _ = one_step(tiny_in_float64())
    for rank in (0, 1):
        assert abs(tp_pair[rank, False]["loss"] - loss) < TOLERANCE
        assert_one_processs_gradients(tp_pair[rank, False]["grads"], grads)


def test_2_x_2_ranks_compute_what_one_process_computes_on_the_whole_batch():
    """4 ranks, 2 dp groups of a TP pair each, every group on its half of the batch: FSDP2 averages the groups'
    gradients, which are then the whole batch's in one process; each group's loss is its half's."""
    grid = spawned_ranks(grid_rank, 4, free_port(), timeout_s=2 * TIMEOUT_S)
    _, grads, _ = one_step(tiny_in_float64())
    halves = [one_step(tiny_in_float64(), slice(4 * h, 4 * h + 4))[0] for h in (0, 1)]
    for rank in range(4):
        assert abs(grid[rank]["loss"] - halves[rank // 2]) < TOLERANCE  # ranks 0, 1: dp group 0
        assert_one_processs_gradients(grid[rank]["grads"], grads)
        assert grid[rank]["collectives"] == {"all_reduce": BLOCKS * (2 + 4)}  # TP's; FSDP2's go through c10d


def test_hybrids_stem_does_more_of_a_forward_than_all_six_blocks():
    """Why a TP rank of `hybrid` is slow (the README's "Measured"): it runs its group's whole batch through what TP
    leaves whole, and the convolutional stem alone costs more of a forward than the blocks it splits."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as flops:
        build_model("hybrid")(torch.zeros(1, 3, 32, 32))
    per_module = {name: sum(counts.values()) for name, counts in flops.get_flop_counts().items()}
    assert per_module["VisionTransformer.conv_proj"] > per_module["VisionTransformer.encoder.layers"], per_module


def test_tp_all_reduces_as_the_readme_derives(tp_pair):
    """Per block, forward: 1 all-reduce per row-wise layer (out_proj, mlp.3); backward: 1 per column-wise layer's
    input gradient (q, k, v, mlp.0). Nothing else: no all-gather (the output is whole), no reduce-scatter."""
    readme = (ROOT / "07-tensor-parallel" / "README.md").read_text()
    assert f"{BLOCKS * 6} all-reduces per forward and backward" in readme
    for rank in (0, 1):
        assert tp_pair[rank, False]["collectives"] == {"all_reduce": BLOCKS * (2 + 4)}


def all_reduce_bytes(preset: str, batch: int, element_bytes: int) -> int:
    """What TP hands to all-reduces in one forward and backward: 6 per block, each of one block input's size (batch
    x tokens x width)."""
    with torch.device("meta"):
        model = build_model(preset)
    return 6 * len(model.encoder.layers) * batch * model.seq_length * model.hidden_dim * element_bytes


def test_each_all_reduce_is_one_block_inputs_size_and_the_readme_states_the_bytes_per_step(tp_pair):
    """The bytes counted on 2 ranks of tiny (8 images in float64) are the formula's; the README's table is the
    formula's for hybrid and giant in fp32 on 2 ranks (a ring all-reduce sends 2 (N-1)/N of its buffer: all of it),
    beside DDP's gradients (test_communication.per_step_megabytes)."""
    for rank in (0, 1):
        assert tp_pair[rank, False]["bytes"] == {"all_reduce": all_reduce_bytes("tiny", 8, 8)}
    readme = (ROOT / "07-tensor-parallel" / "README.md").read_text()
    stated = re.search(r"<!-- communication -->\n(.*?)<!-- /communication -->", readme, re.S).group(1)
    for preset, batch, shown in (("hybrid", 128, "`hybrid` (17 tokens, width 192)"),
                                 ("giant", 2, "`giant` (65 tokens, width 1,536), batch 2")):
        tp, ddp = all_reduce_bytes(preset, batch, 4) / 1e6, per_step_megabytes(preset, 2)["ddp"]
        assert f"| {shown} | {tp:,.1f} MB | {ddp:,.1f} MB | {tp / ddp:.{1 if tp > ddp else 2}f}x |" in stated


def test_activation_checkpointing_under_tp_changes_no_bit_and_all_reduces_forward_again(tp_pair):
    """Recomputing a block's forward in backward gives the same numbers (the same kernels on the same inputs), and
    all-reduces again what backward needs: out_proj's output (the second norm saves it), not mlp.3's, whose output
    nothing saves: torch's checkpoint stops recomputing at the last tensor backward needs (early_stop). 1 more per
    block."""
    for rank in (0, 1):
        plain, checkpointed = tp_pair[rank, False], tp_pair[rank, True]
        assert checkpointed["loss"] == plain["loss"]
        assert_same_weights(checkpointed["grads"], plain["grads"])
        assert checkpointed["collectives"] == {"all_reduce": BLOCKS * (2 + 1 + 4)}
