"""The model every step trains: torchvision's VisionTransformer, sized for 32x32 images."""
import math
import re
import warnings
from functools import partial

import torch
from torch import nn
from torchvision.models.vision_transformer import ConvStemConfig, EncoderBlock, VisionTransformer

from .errors import fail

# A convolutional stem (stem: the (channels, stride) of each of its 3x3 convolutions) or, without one, a
# stride-4 patchify turns a 32x32 image into tokens (+1 class token).
# hybrid (the default): 75% and more in 10 epochs on a 2-core laptop (benchmarks/published/archive/recipe-search/); a
# stride-1 convolution before each stride-2 one, down to 4x4 = 16 tokens.
# tiny: 3x fewer parameters, 8x8 = 64 tokens; the tests train it (it leaves chance level within a few steps).
# small: a larger model for GPUs. base/large/huge/giant: the memory lessons of steps 03/04 (86M to ~1B).
PRESETS = {
    "tiny": dict(num_layers=6, num_heads=4, hidden_dim=128, mlp_dim=256, stem=((32, 2), (64, 2))),
    "hybrid": dict(num_layers=6, num_heads=6, hidden_dim=192, mlp_dim=384,
                   stem=((32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2))),
    "small": dict(num_layers=8, num_heads=6, hidden_dim=384, mlp_dim=1536),
    "base": dict(num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072),
    "large": dict(num_layers=24, num_heads=16, hidden_dim=1024, mlp_dim=4096),
    "huge": dict(num_layers=32, num_heads=16, hidden_dim=1280, mlp_dim=5120),
    "giant": dict(num_layers=36, num_heads=16, hidden_dim=1536, mlp_dim=6144),
}

DEFAULT_PRESET = "hybrid"

# The stem ends in a 1x1 convolution whose weight gradient comes with other strides (on its size-1
# dimensions) than the weight: DDP copies those numbers (8,192 in tiny) into its bucket instead of viewing them,
# and would say so once per process, in every step.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")

# The unit that FSDP shards and gathers one at a time (steps 03 and 04).
TRANSFORMER_BLOCK = EncoderBlock


def build_model(preset: str, num_classes: int = 10) -> VisionTransformer:
    if preset not in PRESETS:
        raise fail(f"unknown --model {preset!r}; choose one of {', '.join(PRESETS)}")
    config = dict(PRESETS[preset])
    stem = config.pop("stem", None)
    if stem:
        # Early convolutions help transformers see better (Xiao et al., 2021). GroupNorm, not BatchNorm:
        # it normalises each image alone, so N DDP ranks still compute exactly what one process does.
        config["conv_stem_configs"] = [ConvStemConfig(c, kernel_size=3, stride=s, norm_layer=partial(nn.GroupNorm, 8))
                                       for c, s in stem]
    patch_size = math.prod(s for _, s in stem) if stem else 4  # the stem's total stride
    return VisionTransformer(image_size=32, patch_size=patch_size, num_classes=num_classes, **config)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class SplitAttention(nn.Module):
    """nn.MultiheadAttention's computation with its q, k and v projections three Linear layers (step 07). torch packs
    them in one weight, [q; k; v] by rows, which a column-wise split over 2 ranks would cut into q and half of k | the
    rest, not into heads: split apart, each splits by heads."""

    def __init__(self, packed: nn.MultiheadAttention):
        super().__init__()
        width, self.head_dim = packed.embed_dim, packed.embed_dim // packed.num_heads
        self.q, self.k, self.v = (nn.Linear(width, width, device=packed.in_proj_weight.device) for _ in range(3))
        for linear, weight, bias in zip((self.q, self.k, self.v), packed.in_proj_weight.chunk(3),
                                        packed.in_proj_bias.chunk(3), strict=True):
            linear.weight, linear.bias = nn.Parameter(weight.detach().clone()), nn.Parameter(bias.detach().clone())
        self.out_proj, self.dropout = packed.out_proj, packed.dropout

    def forward(self, x, *_, **__):  # called as EncoderBlock calls nn.MultiheadAttention: (x, x, x, need_weights=False)
        batch, length, _ = x.shape  # -1 below: the heads this rank holds (all of them without TP)
        q, k, v = (p(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(y.transpose(1, 2).reshape(batch, length, -1)), None


def split_attention(model: nn.Module) -> nn.Module:
    """Every block's attention as SplitAttention: the same function, the same weights."""
    for module in model.modules():
        if isinstance(module, TRANSFORMER_BLOCK):
            module.self_attention = SplitAttention(module.self_attention)
    return model


def pack_attention(weights: dict) -> dict:
    """A split_attention model's weights as build_model's keys (q, k and v packed into in_proj), for step 06."""
    packed = {}
    for key, value in weights.items():
        prefix, dot, name = key.rpartition(".self_attention.q.")
        if dot:
            parts = [weights[f"{prefix}.self_attention.{p}.{name}"] for p in "qkv"]
            packed[f"{prefix}.self_attention.in_proj_{name}"] = torch.cat(parts)
        elif not re.search(r"\.self_attention\.[kv]\.", key):
            packed[key] = value
    return packed
