"""Step 02 fed by Ray Data: the same training, reading a Ray Dataset on a two-node Ray cluster."""
from common import build_model
from conftest import assert_sane_summary, final_json, latest_ray_checkpoint, load_weights, ray_script

RAY_DATA = "02-ray-train-ddp/train_ray_ddp_with_ray_data.py"


def test_ray_data_feeds_two_workers_and_reports(ray_cluster, tmp_path):
    result = ray_script(RAY_DATA, ray_cluster, tmp_path)
    summary = final_json(result)
    assert_sane_summary(summary, "ray_ddp_data", world_size=2)  # includes: the loss fell from epoch 1 to 2
    assert summary["nodes"] == 2  # one worker per node: one of them reads its blocks from the other node
    assert result.stdout.count("parameters | data:") == 1  # rank 0 alone prints
    build_model("tiny").load_state_dict(load_weights(latest_ray_checkpoint(tmp_path)))
