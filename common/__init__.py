"""Model, data and recipe code shared by every step, so each script shows only its distributed lesson.

Import a name from the module that defines it (`from common.model import build_model`). The package itself imports
nothing: a process that needs none of it imports no torch (Ray's worker setup hook, common.worker_setup: torch
imported before Ray sets a worker's OMP_NUM_THREADS would train with a thread per core)."""
