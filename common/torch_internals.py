"""Every private name of torch (2.14) that the steps use, in one place, each with why no public way does it.
tests/test_torch_internals.py fails when a torch release moves or renames one."""
import contextlib

import torch

# Tensors of shapes and dtypes alone, whose operations run each kernel's own shape rules and save for backward
# what the real kernel would, allocating nothing: what step 04's will_it_fit.py builds a model of. torch's
# public torch.device("meta") allocates nothing too, but runs no CPU kernel's choices (attention's among them).
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401

# Activation checkpointing of a module as it is: hooks that keep its input and recompute the rest in backward
# (torch.utils.checkpoint, non-reentrant). The public torch.utils.checkpoint needs the block's forward rewritten, and
# torch's checkpoint_wrapper renames every parameter of the block it wraps; FSDP2's fully_shard composes with this.
from torch.distributed._composable import checkpoint as checkpoint_activations  # noqa: F401


def storage_key(tensor: torch.Tensor) -> int:
    """One number per storage: a view and the tensor it views share it, so bytes are counted once. The public
    data_ptr() is 0 on every fake tensor (with a warning that it is deprecated there), which has no memory; the
    storage's C++ handle tells storages apart on both."""
    return tensor.untyped_storage()._cdata


@contextlib.contextmanager
def autocast_on_fake_tensors(device_type: str, enabled: bool):
    """torch.autocast to bf16 for a trace on fake tensors of device_type. torch.autocast("cuda") turns itself off,
    with a warning, on a machine without a GPU (torch/amp/autocast_mode.py), though fake CUDA tensors need none; this
    sets the state its __enter__ and __exit__ set, so the trace makes the casts (and keeps in fp32 the ops) of that
    device's own autocast."""
    if not enabled:
        yield
        return
    was_enabled, was_dtype = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, torch.bfloat16)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, was_enabled)
        torch.set_autocast_dtype(device_type, was_dtype)


@contextlib.contextmanager
def fused_attention_on_fake_cuda():
    """scaled_dot_product_attention on fake CUDA tensors as a GPU runs it. With no device to ask which fused kernel it
    has, torch falls back to the math kernel, which saves the L x L attention matrix that no GPU run keeps. A GPU runs
    a fused kernel (cuDNN's or flash attention for bf16, memory-efficient attention for fp32: torch's priority order,
    aten/src/ATen/native/transformers/cuda/sdp_utils.cpp); each saves the inputs, the output and one float per row
    (the log-sum-exp): so do the aten ops traced here. nn.MultiheadAttention looks the function up in
    torch.nn.functional at each call, where this replaces it for the trace; with a mask the math kernel stays."""
    functional, math_or_fused = torch.nn.functional, torch.nn.functional.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **rest):
        if query.device.type != "cuda" or attn_mask is not None or rest:
            return math_or_fused(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **rest)
        if torch.is_autocast_enabled("cuda"):
            query, key, value = (t.to(torch.bfloat16) for t in (query, key, value))
        if query.dtype == torch.float32:
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, None, True, dropout_p, is_causal, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, scale=scale)[0]

    functional.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = math_or_fused
