"""Model, data and recipe code shared by every step, so each script shows only its distributed lesson."""
from .data import augment_batch, load_data, normalize
from .flags import make_parser
from .model import PRESETS, TRANSFORMER_BLOCK, build_model, count_params
from .training import (crash_one_rank, epoch_line, evaluate, gather_from_ranks, load_checkpoint, make_optimizer,
                       make_scheduler, memory_table, peak_memory_mb, predict, save_checkpoint, state_memory_mb,
                       this_node)

__all__ = ["augment_batch", "load_data", "normalize", "make_parser", "PRESETS", "TRANSFORMER_BLOCK", "build_model",
           "count_params", "crash_one_rank", "epoch_line", "evaluate", "gather_from_ranks", "load_checkpoint",
           "make_optimizer", "make_scheduler", "memory_table", "peak_memory_mb", "predict", "save_checkpoint",
           "state_memory_mb", "this_node"]
