"""Checkpoint files: written whole or not at all, read back only into the run they fit, and a sharded model saved
whole for inference."""
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from .errors import fail


def save_full_model(model, optimizer, path: Path, as_built=lambda weights: weights) -> None:
    """A sharded model (FSDP2, TP) whole, for build_model() on one device (step 06); as_built renames what the
    step changed in build_model's modules. Training is over and saved: its state goes first, so that rank 0 holds
    its shard and one full copy, not the training state as well."""
    optimizer.zero_grad(set_to_none=True)
    optimizer.state.clear()
    # A collective: every rank sends its slices, rank 0 alone receives the whole model (in RAM).
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # On a 2-D mesh (step 07) each weight comes whole in 2 all-gathers, one per dimension, which DTensor warns of
    # on every rank: a line per rank for a gather made once, copying what no reduction changes.
    redistribute = logging.getLogger("torch.distributed.tensor._redistribute")
    level = redistribute.level
    redistribute.setLevel(logging.ERROR)
    try:
        full_weights = get_model_state_dict(model, options=options)
    finally:
        redistribute.setLevel(level)
    if dist.get_rank() == 0:
        torch.save(as_built(full_weights), path)


def save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-save leaves the previous checkpoint intact


def load_checkpoint(path: Path, args) -> dict:
    if not path.exists():
        raise fail(f"--resume but no checkpoint at {path}; run without --resume to start fresh")
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_compatible(path, state["model_preset"], state["epoch"] + 1, args)
    return state


def check_compatible(path, preset: str, epochs_done: int, args) -> None:
    """A checkpoint resumes only the same model, and only if epochs are left to train."""
    if preset != args.model:
        raise fail(f"{path} holds a --model {preset} checkpoint, not {args.model}; "
                   f"pass --model {preset} or another --checkpoint-dir")
    if epochs_done >= args.epochs:
        raise fail(f"{path} has already trained {epochs_done} of --epochs {args.epochs}; "
                   f"pass a larger --epochs to train on, or another --checkpoint-dir")
