"""Model, data and recipe code shared by every step, so each script shows only its distributed lesson.

`from common import build_model` works as usual; each name's module is imported on first use, so that a process
which needs none of them imports no torch (Ray's worker setup hook, common.worker_setup: torch imported before Ray
sets a worker's OMP_NUM_THREADS would train with a thread per core)."""
import importlib

_MODULES = {
    "data": ["augment_batch", "load_data", "normalize"],
    "flags": ["make_parser"],
    "model": ["PRESETS", "TRANSFORMER_BLOCK", "build_model", "count_params"],
    "training": ["crash_one_rank", "epoch_line", "evaluate", "gather_from_ranks", "load_checkpoint", "make_optimizer",
                 "make_scheduler", "memory_table", "peak_memory_mb", "predict", "save_checkpoint", "save_full_model",
                 "this_node"],
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'common' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
