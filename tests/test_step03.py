"""Step 03: FSDP through prepare_model(parallel_strategy="fsdp"). FSDP1 needs CUDA GPUs, so on CPU the
tests check the lesson's size and the one-line refusal; the training path itself runs on GPUs only."""
import subprocess

from conftest import ROOT, SMOKE, python

RAY_FSDP = "03-ray-train-fsdp/train_ray_fsdp.py"
# The strategy argument, the auto-wrap policy, gathering/scattering full state dicts for checkpoints, the
# GPU check and the docstring: nothing else may differ from step 02. README.md quotes the count.
MAX_CHANGED_LINES = 43


def test_step02_to_step03_diff_is_only_the_fsdp_lesson():
    diff = subprocess.run(["diff", "-u", "02-ray-train-ddp/train_ray_ddp.py", RAY_FSDP], cwd=ROOT,
                          capture_output=True, text=True).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) <= MAX_CHANGED_LINES, "\n".join(changed)
    assert 'parallel_strategy="fsdp"' in diff and "ModuleWrapPolicy({TRANSFORMER_BLOCK})" in diff


def test_without_gpus_it_stops_at_once_and_points_to_step_04(ray_cluster, tmp_path):
    result = python(RAY_FSDP, *SMOKE, "--num-workers", "2", "--address", ray_cluster,
                    "--checkpoint-dir", str(tmp_path), timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "needs 2 or more CUDA GPUs" in result.stderr and "run step 04" in result.stderr
