"""What the README's install takes: its download, its disk, the CUDA libraries' share, and the CPU path's disk.

    python benchmarks/install_size.py --cpu-wheel /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
        --out benchmarks/published/install    # about 7 min from a local mirror (2-core AMD EPYC Zen 4)

Fresh virtual environments with this Python, one after the other, nothing taken from pip's cache:
1. the README's first command's install, `pip install -r requirements.txt`, timed (from the indexes pip is given);
   the environment's size on disk, and the CUDA libraries' within it (the nvidia and triton packages);
2. its wheels downloaded alone (`pip download`, the local package aside): their size is what the install downloads;
3. the README's CPU path: the same requirements with a +cpu wheel of torch (--cpu-wheel, as PyTorch's CPU index
   has it) and the torchvision that matches it; this machine reaches no CPU index, so the wheel's version, if not
   the pinned one, is recorded beside the size.
Writes results.json; README.md quotes it (tests/test_prose_numbers.py holds its sentences to it).
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import ROOT, describe_commit, describe_machine, made_by

GB = 1e9  # as pip shows sizes (du -h shows GiB, 2^30 bytes)
CUDA_PACKAGES = ("nvidia", "triton")  # site-packages folders of the CUDA libraries that PyPI's torch pulls in
DEADLINE_S = 1800  # one install from a slow mirror; past it the benchmark fails


def size_of(folder: Path) -> int:
    """Bytes on disk under folder (du's blocks, as the README's "of disk" means)."""
    return int(subprocess.run(["du", "-s", "--block-size=1", folder], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def fresh_venv(work: Path, name: str) -> Path:
    """A new virtual environment's python."""
    subprocess.run([sys.executable, "-m", "venv", work / name], check=True, timeout=DEADLINE_S)
    return work / name / "bin" / "python"


def pip(python: Path, *args) -> float:
    """Seconds that pip took; its cache off, so that every wheel comes from the index."""
    start = time.monotonic()
    subprocess.run([python, "-m", "pip", "-q", "--no-cache-dir", *args], check=True, cwd=ROOT, timeout=DEADLINE_S)
    return time.monotonic() - start


def site_packages(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages"))


def pinned_torch() -> str:
    return re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-wheel", type=Path, required=True, help="a torch +cpu wheel for this Python")
    parser.add_argument("--out", type=Path, default=Path("results/install"))
    args = parser.parse_args()
    made = made_by(describe_commit(("requirements.txt",), "the requirements"))
    cpu_version = re.match(r"torch-([^-]+)-", args.cpu_wheel.name).group(1)
    with tempfile.TemporaryDirectory(prefix="install-") as work:
        work = Path(work)
        readme = fresh_venv(work, "readme")
        install_s = pip(readme, "install", "-r", "requirements.txt")
        packages = site_packages(readme)
        cuda = sum(size_of(path) for name in CUDA_PACKAGES for path in packages.glob(f"{name}*") if path.is_dir())
        wheels = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
                  if line.strip() and not line.startswith(("#", "-e"))]
        pip(readme, "download", "-d", work / "wheels", *wheels)
        cpu = fresh_venv(work, "cpu")
        pip(cpu, "install", args.cpu_wheel, *[line for line in wheels if not line.startswith("torch")], "torchvision",
            "-e", ".")  # the torchvision that matches the wheel's torch
        sizes = dict(readme=size_of(work / "readme"), download=size_of(work / "wheels"), cuda=cuda,
                     cpu=size_of(work / "cpu"))
    results = dict(**made, machine=describe_machine(), python=sys.version.split()[0], torch_pinned=pinned_torch(),
                   torch_cpu=cpu_version, install_seconds=round(install_s),
                   gb={name: round(size / GB, 1) for name, size in sizes.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
