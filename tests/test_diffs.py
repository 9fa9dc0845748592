"""The designed pairs of step scripts: `diff -u` between them must show that pair's lesson and little else.
README.md lists these commands; a pair may shrink, and its bound with it, but never grow unnoticed."""
import subprocess

import pytest

from conftest import ROOT

# (older script, newer script, most changed lines, a line that must be in the diff: the lesson itself)
DESIGNED_PAIRS = [
    ("01-vanilla-pytorch-ddp/train_single_machine.py", "01-vanilla-pytorch-ddp/train_ddp.py", 57,
     "+    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == \"cuda\" else None)"),
    ("01-vanilla-pytorch-ddp/train_ddp.py", "02-ray-train-ddp/train_ray_ddp.py", 122,
     "+    model = ray.train.torch.prepare_model(model)"),
    ("02-ray-train-ddp/train_ray_ddp.py", "02-ray-train-ddp/train_ray_ddp_with_ray_data.py", 88,
     "+        datasets={\"train\": train_dataset(data, args.seed)},"),
    ("02-ray-train-ddp/train_ray_ddp.py", "03-ray-train-fsdp/train_ray_fsdp.py", 47,
     '+        model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs=fsdp)'),
    ("02-ray-train-ddp/train_ray_ddp.py", "04-ray-train-fsdp2/train_ray_fsdp2.py", 113,
     "+    shard_model(model, args, device)  # replaces prepare_model; the optimizer must come after it"),
]


def changed_lines(old: str, new: str) -> list:
    diff = subprocess.run(["diff", "-u", old, new], cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize("old, new, bound, lesson", DESIGNED_PAIRS, ids=[new for _, new, _, _ in DESIGNED_PAIRS])
def test_designed_pair_shows_its_lesson_and_stays_small(old, new, bound, lesson):
    changed = changed_lines(old, new)
    assert lesson in changed
    assert len(changed) <= bound, f"diff -u {old} {new}: {len(changed)} changed lines, bound {bound}"


def test_readme_names_every_designed_pair():
    readme = (ROOT / "README.md").read_text()
    for old, new, _, _ in DESIGNED_PAIRS:
        assert f"diff -u {old} {new}" in readme
