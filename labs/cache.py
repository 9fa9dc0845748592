"""The reference runs a lab's check compares with, kept once per machine for the code as it is: their file's name
holds a digest of everything they depend on."""
import hashlib
import os
import platform
from pathlib import Path

import torch

from labs import harness

# Where the reference runs are kept, once per machine for the code as it is: the checks compare every try of a lab
# with the same runs, which depend on this repository's code alone, never on the attendee's file.
CACHE = Path(os.environ.get("LABS_CACHE", Path.home() / ".cache" / "ray-train-workshop" / "labs"))
REFERENCE_CODE = ("common/*.py", "labs/cache.py", "labs/checkpoints.py", "labs/harness.py", "labs/patching.py",
                  "labs/ranks.py", "labs/ray_runs.py", "labs/reference.py", "labs/watch.py", "labs/checks/*.py",
                  "labs/solutions/*.py")
# What holds torch's, MKL's and oneDNN's kernels below what the processor offers: a reference run rounds with them.
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                   "OPENBLAS_CORETYPE")


def cached(name: str) -> Path:
    """The file that keeps the reference run `name`: its name holds a digest of everything the run depends on (the
    code in REFERENCE_CODE, the lab's flags, torch's version, the kernels it ran), so a change to any of them makes a
    new run."""
    # the harness's flags and root, as lab_args reads them: one binding, whatever a test replaces
    digest = hashlib.sha256(f"{name} {harness.LAB_FLAGS} {torch.__version__} {kernels()}".encode())
    for path in sorted(path for pattern in REFERENCE_CODE for path in harness.ROOT.glob(pattern)):
        digest.update(path.read_bytes())
    return CACHE / f"{name}-{digest.hexdigest()[:16]}.pt"


def kernels() -> str:
    """What chooses the kernels a run rounds with: the processor, the instruction sets torch uses on it, and the
    settings that hold them lower (KERNEL_SETTINGS)."""
    settings = {key: os.environ[key] for key in KERNEL_SETTINGS if key in os.environ}
    return f"{processor()} {torch.backends.cpu.get_cpu_capability()} {settings}"


def processor() -> str:
    """The processor's make, model and instruction sets: Linux's /proc/cpuinfo, elsewhere what platform says."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    fields = ("vendor_id", "cpu family", "model", "model name", "flags")
    return " ".join(line for line in first.splitlines() if line.split(":")[0].strip() in fields)


def load_reference(name: str):
    """The reference run `name` as kept by save_reference, or None if the code as it is never ran it here."""
    path = cached(name)
    return torch.load(path, weights_only=False) if path.exists() else None


def save_reference(name: str, result):
    """Keeps a reference run's result (written whole or not at all: checks may run side by side); returns it."""
    path = cached(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    torch.save(result, partial)
    os.replace(partial, path)
    return result
