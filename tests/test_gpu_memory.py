"""benchmarks/gpu_memory.py, the GPU's memory beside will_it_fit.py's prediction, checked on CPU so that no device time
is spent on a typo: its dry run measures two runs in fresh processes and writes its files; the published table is
what --render makes of the published results.json with today's will_it_fit.py (never retyped)."""
import json
import shutil

import pytest

from conftest import ROOT
from processes import python

PUBLISHED = ROOT / "benchmarks" / "published" / "gpu-memory-nvidia-h200"


@pytest.mark.timeout(180)
def test_the_dry_run_measures_two_runs_in_fresh_processes_and_writes_its_files(tmp_path):
    result = python("benchmarks/gpu_memory.py", "--dry-run", "--out", str(tmp_path), timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["model"], r["name"]) for r in rows] == [("tiny", "ddp"), ("tiny", "fsdp2")]
    for row in rows:  # on CPU no peaks, but the state each run held, as the prediction counts it
        assert "error" not in row["measured"], row["measured"]
        assert {k: row["measured"][k] for k in ("params", "grads", "optimizer")} == \
               {k: row["predicted"][k] for k in ("params", "grads", "optimizer")}
    assert "tiny | 16 | ddp |" in (tmp_path / "results.md").read_text()


@pytest.mark.timeout(120)
def test_the_published_table_is_rendered_from_its_json(tmp_path):
    shutil.copy(PUBLISHED / "results.json", tmp_path)
    result = python("benchmarks/gpu_memory.py", "--render", str(tmp_path), timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "results.md").read_text() == (PUBLISHED / "results.md").read_text(), \
        "rerun: python benchmarks/gpu_memory.py --render benchmarks/published/gpu-memory-nvidia-h200"
