"""Model, data and recipe code shared by every step, so each script shows only its distributed lesson."""
from .data import augment_batch, load_data, normalize
from .model import PRESETS, TRANSFORMER_BLOCK, build_model, count_params
from .training import (epoch_line, evaluate, load_checkpoint, make_optimizer, make_parser, make_scheduler,
                       memory_table, peak_memory_mb, per_rank_batch_size, save_checkpoint, state_memory_mb)

__all__ = ["augment_batch", "load_data", "normalize", "PRESETS", "TRANSFORMER_BLOCK", "build_model",
           "count_params", "epoch_line", "evaluate", "load_checkpoint", "make_optimizer", "make_parser",
           "make_scheduler", "memory_table", "peak_memory_mb", "per_rank_batch_size", "save_checkpoint",
           "state_memory_mb"]
