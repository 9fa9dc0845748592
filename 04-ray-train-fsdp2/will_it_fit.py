r"""Will it fit? Memory per rank and communication per optimizer step of DDP, FSDP1 and FSDP2, from
the model's shapes alone: the model is built of fake tensors (torch's FakeTensorMode: shapes and
dtypes, no data), and nothing it would hold is allocated.

    python 04-ray-train-fsdp2/will_it_fit.py --num-workers 2
    python 04-ray-train-fsdp2/will_it_fit.py --model giant --num-workers 8 --mixed-precision \
        --memory-per-device 80GiB
    python 04-ray-train-fsdp2/will_it_fit.py --module torchvision.models:resnet50 \
        --block Bottleneck --input-shape 3,224,224

Parameters, gradients and AdamW's state are counted from the shapes as each strategy shards them
(FSDP2 splits every parameter on dim 0, padded to a multiple of the ranks; FSDP1 one flat vector per
unit, padded too). Activations are measured: one forward pass of fake tensors of the device's kind,
adding up the bytes of the tensors autograd saves for backward, under autocast to bf16 where the
steps use it (on cuda; --autocast or --no-autocast to choose): autocast's bf16 copies of the
weights count, and what that device's autocast keeps in fp32. How close this comes to real runs,
and what "peak" means: benchmarks/published/will-it-fit/results.md; on a GPU:
.../gpu-memory-nvidia-h200/. The flags that change memory are step 04's (FSDP2's).
"""

import argparse
import importlib
import math
import re
from dataclasses import dataclass

import torch

from common.errors import fail
from common.flags import Parser, add_fsdp2_flags
from common.model import DEFAULT_PRESET, PRESETS, TRANSFORMER_BLOCK, build_model
from common.torch_internals import (FakeTensorMode, autocast_on_fake_tensors,
                                    fused_attention_on_fake_cuda, storage_key)
from common.training import make_optimizer

STRATEGIES = ("ddp", "fsdp1", "fsdp2")
ADAMW_STEP_BYTES = 4  # AdamW keeps a float32 step count per parameter tensor, beside its moments
FSDP1_ALIGNMENT_BYTES = 16  # FSDP1 (use_orig_params, as step 03) aligns each parameter to 16 B
DDP_BUCKET_BYTES = (2**20, 25 * 2**20)  # DDP's first bucket, then every other (bucket_cap_mb)
# What a GPU process keeps beside the tensors, measured on an H200 (CUDA 13, torch 2.11):
# benchmarks/published/gpu-memory-nvidia-h200. The process's own device memory outside torch's
# allocator: CUDA's context (619 MiB), NCCL's communicator (558 MiB for one rank) and cuBLAS' and
# cuDNN's (148 MiB), 1,326.8 MiB at most; then what the caching allocator reserves beyond the live
# tensors at the peak, the worst share of the runs that peak above 1 GiB (giant's DDP in fp32:
# 23,318 / 19,748.3 MiB, 18.1%). Both rounded up.
CUDA_KEEPS_BYTES = 1327 * 2**20
# Inside torch's allocator, beside the tensors: cuBLAS's workspaces, 32 MiB each on Hopper and
# Blackwell (torch's default per cuBLAS handle and stream, aten/src/ATen/cuda/CublasHandlePool.cpp;
# 8.1 MiB on older GPUs). Measured on the H200: every hybrid run peaks 61 to 66 MiB over its
# tensors, two of them (forward and backward run on two threads, each with its own handle).
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20
ALLOCATOR_RESERVE = 0.19
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass
class Estimate:
    strategy: str
    params: int  # bytes on this rank
    grads: int
    optimizer: int
    activations: int
    peak: int  # on the device (the GPU): what must fit
    host: int  # in host memory: the sharded state under --cpu-offload
    collectives: dict  # name -> [count, bytes handed to it]
    sent: float  # bytes each rank sends per optimizer step (ring algorithms)


def main():
    args = parse_args()
    model = build_fake(args)
    activations = activation_bytes(args)
    estimates = [estimate(model, s, args, activations) for s in chosen(args.strategy)]
    print(describe(model, args))
    print(memory_table(estimates, args))
    print(communication_table(estimates, args))
    if args.memory_per_device:
        print(verdict(estimates, args))


def parse_args(argv=None):
    p = Parser(__doc__, check=lambda parser, args: None)  # argparse, its errors on one line
    p.add_argument("--model", default=DEFAULT_PRESET, choices=PRESETS, help="common/model.py's")
    p.add_argument("--module", help="any model instead: pkg.module:factory, called with nothing")
    p.add_argument("--input-shape", default="3,32,32", help="an example's shape, for --module")
    p.add_argument("--block", default=TRANSFORMER_BLOCK.__name__,
                   help="class name of FSDP's units (default: the transformer block, as 03-04)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--strategy", default="all", choices=[*STRATEGIES, "all"])
    add_fsdp2_flags(p)  # step 04's own flags, with its help and defaults
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="as the steps run there: on cuda fused AdamW, pinned offload, CUDA's own")
    p.add_argument("--autocast", action=argparse.BooleanOptionalAction,
                   help="autocast to bf16 (default: as the steps, on cuda only)")
    p.add_argument("--adamw", choices=("fused", "foreach", "single-tensor"),
                   help="AdamW's kind (default: the steps', fused on cuda, else single-tensor)")
    p.add_argument("--batch-size", type=int, default=128, help="global, as the steps take it")
    p.add_argument("--memory-per-device", type=memory_size, help="e.g. 80GiB, 24GB: which ones fit")
    p.add_argument("--headroom", type=memory_size,
                   help="device memory the verdict keeps free (default: CUDA's, the allocator's)")
    args = p.parse_args(argv)
    check(args)
    args.adamw = args.adamw or ("fused" if args.device == "cuda" else "single-tensor")
    return args


def memory_size(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]i?B|B)\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is no size; write it as 80GiB, 24GB or 512MiB")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


def check(args) -> None:
    if args.num_workers < 1:
        raise fail(f"--num-workers {args.num_workers} must be 1 or more")
    if args.grad_accum_steps < 1:
        raise fail(f"--grad-accum-steps {args.grad_accum_steps} must be 1 or more")
    if args.batch_size % (args.num_workers * args.grad_accum_steps):
        raise fail(f"--batch-size {args.batch_size} must split evenly into --num-workers "
                   f"{args.num_workers} x --grad-accum-steps {args.grad_accum_steps} micro-batches")
    if args.activation_checkpointing:  # its peak is in backward, where a block is recomputed
        raise fail("--activation-checkpointing is not modelled yet: the peak moves into backward, "
                   "which this forward-only trace does not follow; predict without it for an upper "
                   "bound")
    fsdp2_only = args.mixed_precision or args.cpu_offload or not args.reshard_after_forward
    if fsdp2_only and args.strategy in ("ddp", "fsdp1"):
        raise fail("--mixed-precision, --cpu-offload and --no-reshard-after-forward are step 04's "
                   "(FSDP2) flags; pass --strategy fsdp2 or all")


def chosen(strategy: str) -> tuple:
    return STRATEGIES if strategy == "all" else (strategy,)


def build_fake(args, dtype=torch.float32, device="cpu") -> torch.nn.Module:
    """The model as fake tensors: built on the meta device (no initialisation), then given fake
    storage. Unlike meta tensors, fake CPU tensors run the CPU kernels' own choices: attention saves
    what the real kernel does, not the math fallback's attention matrix."""
    with torch.device("meta"):
        model = build(args).to(dtype)
    with FakeTensorMode(allow_non_fake_inputs=True):  # the meta parameters, which to_empty replaces
        return model.to_empty(device=device)


def build(args) -> torch.nn.Module:
    if not args.module:
        return build_model(args.model)
    module_name, _, factory = args.module.partition(":")
    try:
        make = getattr(importlib.import_module(module_name), factory)
    except (ImportError, AttributeError, ValueError) as e:
        raise fail(f"--module {args.module}: {e}; write it as package.module:factory") from None
    return make()


def micro_batch(args) -> int:
    return args.batch_size // args.num_workers // args.grad_accum_steps


def input_shape(args) -> tuple:
    try:
        return tuple(int(d) for d in args.input_shape.split(",")) if args.module else (3, 32, 32)
    except ValueError:
        raise fail(f"--input-shape {args.input_shape} must be integers, as 3,224,224") from None


def autocasts(args) -> bool:
    return args.device == "cuda" if args.autocast is None else args.autocast


def activation_bytes(args) -> int:
    """What one micro-batch's forward pass leaves saved for backward: the tensors autograd keeps
    (not the weights, counted already), each storage once, traced on the device's kind of fake
    tensors. bf16 weights under --mixed-precision (FSDP2 casts weights and inputs); under autocast
    its bf16 copies of the weights, and the ops that device's autocast keeps in fp32 (CUDA's
    layer and group norms, softmax, the loss), as it runs them."""
    dtype = torch.bfloat16 if args.mixed_precision else torch.float32
    model = build_fake(args, dtype, args.device)
    weights = {storage_key(p) for p in model.parameters()}
    saved = {}

    def keep(t):
        if storage_key(t) not in weights:
            saved[storage_key(t)] = t.untyped_storage().nbytes()
        return t

    fake_mode = next(model.parameters()).fake_mode
    with (fake_mode, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
          autocast_on_fake_tensors(args.device, autocasts(args)), fused_attention_on_fake_cuda()):
        x = torch.empty(micro_batch(args), *input_shape(args), dtype=dtype, device=args.device)
        try:
            model(x)
        except RuntimeError as e:
            raise fail(f"the model's forward failed on a batch of shape {tuple(x.shape)}: "
                       f"{str(e).splitlines()[0]}; check --input-shape") from None
    return sum(saved.values())


def units(model, block: str) -> list:
    """FSDP's units as steps 03 and 04 wrap them: every --block module, then the root with what is
    left."""
    blocks = [m for m in model.modules() if type(m).__name__ == block]
    if not blocks:
        raise fail(f"the model has no {block} module to shard; pass --block with one of its own")
    inside = {id(p) for b in blocks for p in b.parameters()}
    return [list(b.parameters()) for b in blocks] + [[p for p in model.parameters()
                                                      if id(p) not in inside]]


def fsdp2_local_numel(p, n: int, rank: int) -> int:
    """FSDP2's shard: dim 0 cut in chunks of ceil(rows / n) (torch.chunk); the last ranks may get
    fewer rows, or none, and all-gather the padding."""
    rows = p.shape[0] if p.dim() else 1
    per_rank = math.ceil(rows / n)
    return max(0, min(per_rank, rows - rank * per_rank)) * (p.numel() // max(rows, 1))


def fsdp2_padded_numel(p, n: int) -> int:
    rows = p.shape[0] if p.dim() else 1
    return math.ceil(rows / n) * n * (p.numel() // max(rows, 1))


def fsdp1_layout(unit: list, n: int) -> tuple:
    """A unit's flat vector (FSDP1, use_orig_params): each parameter's [start, end), every start
    16-byte aligned, and the vector's length padded to a multiple of n."""
    align = FSDP1_ALIGNMENT_BYTES // unit[0].element_size()
    spans, offset = [], 0
    for p in unit:
        offset = math.ceil(offset / align) * align
        spans.append((offset, offset + p.numel()))
        offset += p.numel()
    return spans, math.ceil(offset / n) * n


def fsdp1_local_numels(unit: list, n: int, rank: int) -> list:
    spans, total = fsdp1_layout(unit, n)
    lo, hi = rank * total // n, (rank + 1) * total // n
    return [max(0, min(end, hi) - max(start, lo)) for start, end in spans]


def local_numels(model, strategy: str, n: int, rank: int, block: str) -> list:
    """The elements of every parameter this rank holds (0: none of it)."""
    if strategy == "ddp":
        return [p.numel() for p in model.parameters()]
    if strategy == "fsdp2":
        return [fsdp2_local_numel(p, n, rank) for p in model.parameters()]
    return [k for unit in units(model, block) for k in fsdp1_local_numels(unit, n, rank)]


def state_bytes(model, strategy: str, n: int, rank: int, block: str) -> tuple:
    """(parameters, gradients, AdamW state) bytes of one rank, fp32: FSDP2's sharded parameters all
    get a gradient and a state (DTensors, if empty here); FSDP1 gives one only to those with
    elements on this rank."""
    numels = local_numels(model, strategy, n, rank, block)
    params = 4 * sum(numels)
    with_state = len(numels) if strategy != "fsdp1" else sum(k > 0 for k in numels)
    return params, params, 2 * params + ADAMW_STEP_BYTES * with_state


def collectives(model, strategy: str, args) -> dict:
    """name -> [count, bytes handed to it] per optimizer step: all-reduce's buffer, all-gather's
    output, reduce-scatter's input. DDP and FSDP skip the gradient sync but in the last micro-batch
    (no_sync)."""
    n, k = args.num_workers, args.grad_accum_steps
    if strategy == "ddp":
        return {"all_reduce": [ddp_buckets(model), 4 * sum(p.numel() for p in model.parameters())]}
    all_units = units(model, args.block)
    if strategy == "fsdp2":
        gathered = [sum(fsdp2_padded_numel(p, n) for p in unit) for unit in all_units]
    else:
        gathered = [fsdp1_layout(unit, n)[1] for unit in all_units]
    gather_bytes = 2 if strategy == "fsdp2" and args.mixed_precision else 4
    # forward gathers every unit; backward the blocks again (the root stays gathered after
    # forward, as every block does under --no-reshard-after-forward)
    again = all_units[:-1] if strategy == "fsdp1" or args.reshard_after_forward else []
    return {"all_gather": [k * (len(all_units) + len(again)),
                           k * gather_bytes * (sum(gathered) + sum(gathered[:len(again)]))],
            "reduce_scatter": [len(all_units), 4 * sum(gathered)]}


def ddp_buckets(model) -> int:
    """How many all-reduces DDP makes: its buckets, filled with the gradients in reverse order."""
    count, filled, cap = 0, 0, DDP_BUCKET_BYTES[0]
    for p in reversed(list(model.parameters())):
        filled += 4 * p.numel()
        if filled >= cap:
            count, filled, cap = count + 1, 0, DDP_BUCKET_BYTES[1]
    return count + (filled > 0)


def ring_sent(calls: dict, n: int) -> float:
    """Bytes one rank sends: an all-reduce 2 (n-1)/n of its buffer, an all-gather or a
    reduce-scatter (n-1)/n."""
    factor = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
    }
    return sum(factor[name] * nbytes for name, (_, nbytes) in calls.items())


def adamw_temporary(model, strategy: str, args, rank: int) -> int:
    """What AdamW's step allocates beside its state (torch 2.14), over the steps' two groups: fused,
    nothing; foreach, a copy of its largest group (the square roots of the second moments, at once);
    single-tensor, one parameter at a time: its square root and the denominator made of it, beside
    the previous parameter's denominator, which lives until the next one replaces it."""
    if args.adamw == "fused":
        return 0
    numels = local_numels(model, strategy, args.num_workers, rank, args.block)
    local = dict(zip(map(id, model.parameters()), numels, strict=True))
    steps = argparse.Namespace(weight_decay=0.05, lr=1e-3)  # their values change no group
    optimizer = make_optimizer(model, steps, torch.device("cpu"))
    groups = [[local[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    if args.adamw == "foreach":
        return 4 * max(sum(g) for g in groups)
    pairs = [zip([0, *g], g, strict=False) for g in groups]  # (the one before, each parameter)
    return 4 * max(previous + 2 * k for pair in pairs for previous, k in pair)


def estimate(model, strategy: str, args, activations: int, rank: int = 0) -> Estimate:
    n = args.num_workers
    params, grads, optimizer = state_bytes(model, strategy, n, rank, args.block)
    calls = collectives(model, strategy, args)
    fsdp2 = strategy == "fsdp2"
    acts = activations if fsdp2 or not args.mixed_precision else activation_bytes(fp32(args))
    temporary = adamw_temporary(model, strategy, args, rank)
    peak = peak_bytes(model, strategy, args, params, grads + temporary, optimizer, acts)
    peak += CUBLAS_WORKSPACE_BYTES if args.device == "cuda" else 0
    offload = offloaded(strategy, args)
    host = host_bytes(model, strategy, args, rank, optimizer + temporary) if offload else 0
    sent = ring_sent(calls, n)
    return Estimate(strategy, params, grads, optimizer, acts, peak, host, calls, sent)


def fp32(args):
    return argparse.Namespace(**{**vars(args), "mixed_precision": False})


def peak_bytes(
    model, strategy: str, args, params: int, step: int, optimizer: int, activations: int
) -> tuple:
    """On the device at the peak. The step's forward and backward hold the weights, AdamW's state
    (from the second step on) and the activations, plus what the strategy adds: DDP a bucket copy of
    every gradient, FSDP the gathered weights of the unit that runs and of the next one, prefetched
    (and the root's, kept gathered). The optimizer step holds the gradients and AdamW's temporary
    (step). Under --grad-accum-steps, the micro-batches after the first run beside the gradients
    summed so far, whole (FSDP reduce-scatters them in the last one only)."""
    n, total = args.num_workers, 4 * sum(p.numel() for p in model.parameters())
    accumulated = total if args.grad_accum_steps > 1 else 0
    if strategy == "ddp":
        return params + total + optimizer + max(activations + accumulated, step)
    sizes = [4 * sum(fsdp2_padded_numel(p, n) for p in unit) for unit in units(model, args.block)]
    weight_bytes = 2 if strategy == "fsdp2" and args.mixed_precision else 4
    resharded = strategy == "fsdp1" or args.reshard_after_forward  # else every block stays gathered
    blocks = 2 * max(sizes[:-1]) if resharded else sum(sizes[:-1])
    gathered = (blocks + sizes[-1]) * weight_bytes // 4
    if offloaded(strategy, args):
        return activations + gathered + max(sizes[:-1]) + accumulated
    return params + optimizer + max(activations + gathered + accumulated, step)


def offloaded(strategy: str, args) -> bool:
    """FSDP2's --cpu-offload moves the shards from the GPU to host memory; on --device cpu they are
    there already, and a run holds what it would without it (measured: the same peak)."""
    return strategy == "fsdp2" and args.cpu_offload and args.device == "cuda"


def host_bytes(model, strategy: str, args, rank: int, optimizer_step: int) -> int:
    """Under --cpu-offload, host memory of one rank: the shards and their gradients, and AdamW's
    state and step. On CUDA the shards and gradients are pinned, and torch's host allocator rounds
    each one up to a power of two."""
    shards = [4 * k for k in local_numels(model, strategy, args.num_workers, rank, args.block)]
    if args.device == "cuda":
        shards = [1 << (b - 1).bit_length() if b else 0 for b in shards]
    return 2 * sum(shards) + optimizer_step


def describe(model, args) -> str:
    count = sum(p.numel() for p in model.parameters())
    flags = [f for f, on in (("bf16", args.mixed_precision), ("cpu offload", args.cpu_offload),
                             ("no reshard after forward", not args.reshard_after_forward)) if on]
    precision = "FSDP2: " + ", ".join(flags) if flags else "fp32 weights"
    autocast = "autocast to bf16" if autocasts(args) else "no autocast"
    cublas = f" | cuBLAS's workspaces in each peak: {mib(CUBLAS_WORKSPACE_BYTES)} MiB"
    return (f"{args.module or args.model} on {args.device}: {count:,} parameters | "
            f"{args.num_workers} ranks x {micro_batch(args)} examples x {args.grad_accum_steps} "
            f"micro-batches per step | {precision} | {autocast} | {args.adamw} AdamW"
            + (cublas if args.device == "cuda" else ""))


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"


def memory_table(estimates: list, args) -> str:
    lines = ["memory of rank 0 (MiB; FSDP's last ranks may hold a little less) | parameters | "
             "gradients | optimizer state | activations | peak | host memory (x ranks a node)",
             "--- | ---: | ---: | ---: | ---: | ---: | ---:"]
    for e in estimates:
        lines.append(f"{label(e, args)} | {mib(e.params)} | {mib(e.grads)} | {mib(e.optimizer)} | "
                     f"{mib(e.activations)} | {mib(e.peak)} | {mib(e.host)}")
    return "\n".join(lines)


def label(e: Estimate, args) -> str:
    fsdp2 = e.strategy == "fsdp2"
    return (e.strategy.upper() + (" (bf16)" if fsdp2 and args.mixed_precision else "")
            + (" (offload)" if fsdp2 and args.cpu_offload else "")
            + (" (no reshard)" if fsdp2 and not args.reshard_after_forward else ""))


def communication_table(estimates: list, args) -> str:
    lines = ["communication per step | collectives (count: MiB handed over) | sent per rank (ring)",
             "--- | --- | ---:"]
    for e in estimates:
        calls = ", ".join(f"{name} ({count}: {mib(nbytes)})"
                          for name, (count, nbytes) in e.collectives.items())
        lines.append(f"{label(e, args)} | {calls} | {mib(e.sent)} MiB")
    return "\n".join(lines)


def verdict(estimates: list, args) -> str:
    """Which strategies fit --memory-per-device, each beside what a GPU process keeps for itself."""
    memory, headroom = args.memory_per_device, args.headroom
    if headroom is not None:
        kept = f"keeping {mib(headroom)} MiB (--headroom)"
    elif args.device == "cpu":
        headroom, kept = 0, "keeping nothing beside (--device cpu: no CUDA)"
    else:
        kept = (f"keeping {mib(CUDA_KEEPS_BYTES)} MiB for CUDA, NCCL and cuBLAS and "
                f"{ALLOCATOR_RESERVE:.0%} of each peak for torch's allocator "
                "(measured on an H200, torch 2.11; --headroom to change)")
    fits = [e for e in estimates if needs(e, headroom) <= memory]
    names = ", ".join(e.strategy.upper() for e in fits) or "none"
    if not fits:
        return (f"on {mib(memory)} MiB per device, {kept}: none fits; add workers, "
                "--mixed-precision, --cpu-offload or --grad-accum-steps (smaller micro-batches)")
    cheapest = min(fits, key=lambda e: (e.sent, e.peak))
    return (f"on {mib(memory)} MiB per device, {kept}: fits {names}; "
            f"cheapest (fewest bytes sent): {cheapest.strategy.upper()}")


def needs(e: Estimate, headroom: int | None) -> float:
    if headroom is None:
        return e.peak * (1 + ALLOCATOR_RESERVE) + CUDA_KEEPS_BYTES
    return e.peak + headroom


if __name__ == "__main__":
    main()
