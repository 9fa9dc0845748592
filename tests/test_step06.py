"""Step 06: inspect a run, then classify images with Ray Data from every step's checkpoint format, on the shared
two-node Ray test cluster. Checkpoints come from the step scripts' own smoke runs on synthetic data."""
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from common.data import load_data
from common.model import build_model
from common.training import evaluate, predict
from common.inference import load_sharded, save_sample_grid
from checks import (assert_same_weights, best_epoch, checkpoint_weights, final_json, latest_ray_checkpoint, load_script,
                    ray_checkpoints)
from conftest import EVAL_IMAGES, forbid_ray
from processes import python

INFER = "06-ray-data-inference/batch_inference.py"


@pytest.fixture(scope="module")
def step06():
    return load_script(INFER)


def infer(address, out, *args, **kwargs):
    return python(INFER, "--address", address, "--out", str(out), *args, **kwargs)


def accuracy_on_one_device(weights: dict, preset: str) -> float:
    model = build_model(preset)
    model.load_state_dict(weights)
    data = load_data("synthetic", "", EVAL_IMAGES)  # the images the smoke runs evaluated
    correct, counted = evaluate(model, data.test_images, data.test_labels, torch.device("cpu")).tolist()
    return correct / counted


def assert_png(path: Path, min_width: int):
    with Image.open(path) as image:
        image.load()  # decodes every pixel: a truncated file fails here
        assert image.format == "PNG" and image.width >= min_width, path


def test_a_step02_run_is_inspected_and_its_best_checkpoint_reproduces_the_runs_accuracy(ray_cluster, ray_run,
                                                                                       tmp_path, step06):
    summary, storage, _ = ray_run
    run = latest_ray_checkpoint(storage).parent
    # The images the run evaluated, 48 per call: the last call gets 16. Two actors, one on each node of the cluster.
    result = infer(ray_cluster, tmp_path, "--checkpoint", str(run), "--data", "synthetic", "--eval-images",
                   str(EVAL_IMAGES), "--actors", "2", "--batch-size", "48")
    inference = final_json(result)
    history = summary["history"]
    best = best_epoch(history)
    # The run's metrics, every epoch, and the best checkpoint by test accuracy, which is the one classified.
    assert all(f"{epoch['train_loss']:.4f}" in result.stdout for epoch in history)
    assert f"(epoch {best['epoch']}, test acc {best['test_accuracy']:.2%})" in result.stdout
    assert inference["accuracy"] == best["test_accuracy"]  # exactly: the same images and weights as the run

    table = pd.read_parquet(tmp_path / "predictions").sort_values("id", ignore_index=True)  # by Ray Data, a row each
    assert table["id"].tolist() == list(range(EVAL_IMAGES))  # every image classified exactly once
    assert inference["counted"] == EVAL_IMAGES == inference["images"]
    assert (table["predicted"] == table["label"]).sum() == inference["correct"]
    assert table["predicted_class"].tolist() == [step06.CLASSES[p] for p in table["predicted"]]
    # Each row's class and probability are the best checkpoint's own prediction for its image.
    model = build_model("tiny")
    model.load_state_dict(torch.load(Path(best_checkpoint(result.stdout)) / "checkpoint.pt",
                                     weights_only=True)["model"])
    with torch.no_grad():
        probability, predicted = predict(model.eval(), load_data("synthetic", "").test_images[:EVAL_IMAGES]).max(1)
    assert table["predicted"].tolist() == predicted.tolist()
    np.testing.assert_allclose(table["probability"], probability.numpy(), rtol=1e-5)
    per_class = table.assign(hit=table["predicted"] == table["label"]).groupby("label")["hit"].mean()
    assert list(inference["per_class_accuracy"].values()) == pytest.approx(per_class.tolist())
    assert_png(tmp_path / "confusion_matrix.png", 500)
    assert_png(tmp_path / "samples.png", 800)

    assert result.stdout.count("model tiny |") == 1 and "Traceback" not in result.stderr
    assert "Data sink Parquet finished" not in result.stderr  # Ray Data's INFO lines stay off the console


def best_checkpoint(stdout: str) -> str:
    """The checkpoint step 06 says it picked: "best checkpoint by test accuracy: PATH (epoch ...)"."""
    [line] = [line for line in stdout.splitlines() if line.startswith("best checkpoint by test accuracy: ")]
    return line.removeprefix("best checkpoint by test accuracy: ").rsplit(" (epoch", 1)[0]


def test_every_checkpoint_format_loads_and_gives_its_epochs_accuracy(step06, ddp_run, ray_run, fsdp2_run):
    """Step 01's checkpoint.pt (and its folder), a step-02 Ray checkpoint (step 03 writes the same), step 04's
    checkpoint folder, model.pt and sharded DCP files: the preset from the checkpoint, the weights of that epoch."""
    fsdp2_history = fsdp2_run[0]["history"]
    fsdp2_first, fsdp2_last = ray_checkpoints(fsdp2_run[1])
    assert not (fsdp2_first / "model.pt").exists()  # only sharded files: the DCP path
    checkpoints = {  # each checkpoint's accuracy in its run, and the formats it can be passed in
        "step 01": (ddp_run[0]["test_accuracy"], [ddp_run[1] / "checkpoint.pt", ddp_run[1]]),  # file, folder
        "step 02 Ray checkpoint": (ray_run[0]["test_accuracy"], [latest_ray_checkpoint(ray_run[1])]),
        "step 04 last": (fsdp2_history[-1]["test_accuracy"], [fsdp2_last, fsdp2_last / "model.pt"]),
        "step 04 sharded (DCP)": (fsdp2_history[0]["test_accuracy"], [fsdp2_first]),
    }
    for name, (accuracy, paths) in checkpoints.items():
        loaded = [step06.load_weights(step06.find_checkpoint(path), None) for path in paths]
        assert [preset for _, preset in loaded] == ["tiny"] * len(paths), name
        for weights, _ in loaded[1:]:  # every format of one checkpoint: the same weights, evaluated once
            assert_same_weights(loaded[0][0], weights)
        if (paths[-1] / "checkpoint.pt").exists():  # steps 01 to 03: what the tests' own plain reader finds there
            assert_same_weights(loaded[0][0], checkpoint_weights(paths[-1]))
        assert accuracy_on_one_device(loaded[0][0], "tiny") == accuracy, name
    # The last sharded checkpoint, loaded without a process group, is exactly the full model.pt export.
    assert_same_weights(torch.load(fsdp2_last / "model.pt", weights_only=True), load_sharded(fsdp2_last, "tiny"))


# Errors found before Ray starts: step 06's main() in this process (main_error), no interpreter to start.
def test_a_wrong_preset_is_a_one_line_error(ray_run, main_error):
    checkpoint = latest_ray_checkpoint(ray_run[1])
    error = main_error(INFER, "--checkpoint", str(checkpoint), "--model", "small", "--data", "synthetic")
    assert "holds a --model tiny checkpoint, not small; pass --model tiny or leave --model out" in error


def test_a_missing_path_is_a_one_line_error(tmp_path, main_error):
    error = main_error(INFER, "--checkpoint", str(tmp_path / "nothing"))
    assert f"no checkpoint at --checkpoint {tmp_path / 'nothing'}" in error


def test_a_folder_with_no_run_is_a_one_line_error_that_names_a_run_when_it_holds_some(ray_run, tmp_path, main_error):
    error = main_error(INFER, "--checkpoint", str(tmp_path))
    assert f"--checkpoint {tmp_path} holds no checkpoint and no Ray run" in error
    storage = ray_run[1]  # --checkpoint-dir: the runs are one level down
    error = main_error(INFER, "--checkpoint", str(storage))
    assert f"pass one of its runs, e.g. {latest_ray_checkpoint(storage).parent}" in error


def test_a_bare_state_dict_needs_model_and_must_fit_it(step06, fsdp2_run, tmp_path):
    shutil.copy(latest_ray_checkpoint(fsdp2_run[1]) / "model.pt", tmp_path)  # away from its Ray metadata
    with pytest.raises(SystemExit, match="does not say which model it holds; pass --model"):
        step06.load_weights(tmp_path / "model.pt", None)
    with pytest.raises(SystemExit, match="does not hold a --model small model"):
        step06.load_weights(tmp_path / "model.pt", "small")
    assert step06.load_weights(tmp_path / "model.pt", "tiny")[1] == "tiny"


def write_image_folder(folder: Path) -> list[Path]:
    """PNGs and a JPEG of several sizes and modes, one in a subfolder and one whose name Ray Data would skip
    ("_..."), plus a text file and a broken PNG. Returns the real images."""
    sizes = {"a.png": (32, 32, "RGB"), "wide.png": (64, 48, "RGB"), "tall_gray.png": (7, 200, "L"),
             "big_alpha.png": (300, 300, "RGBA"), "palette.png": (33, 31, "P"), "_underscore.png": (40, 40, "RGB"),
             "more/photo.jpg": (60, 50, "RGB")}
    rng = np.random.default_rng(0)
    (folder / "more").mkdir(parents=True)
    for name, (width, height, mode) in sizes.items():
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))  # a PNG signature, then nothing valid
    return [(folder / name).resolve() for name in sizes]


def test_a_folder_of_images_every_image_classified_once_bad_files_named_in_one_line(cluster_driver, main_summary,
                                                                                     fsdp2_run, tmp_path, step06):
    """The script's main() in this process, on the test cluster (cluster_driver)."""
    images = write_image_folder(tmp_path / "photos")
    model_pt = latest_ray_checkpoint(fsdp2_run[1]) / "model.pt"
    out = tmp_path / "out"
    inference, stdout = main_summary(INFER, "--address", cluster_driver, "--out", str(out), "--checkpoint",
                                     str(model_pt), "--images", str(tmp_path / "photos"), "--batch-size", "3")
    table = pd.read_parquet(out / "predictions")
    assert sorted(table["path"]) == sorted(map(str, images)) and inference["images"] == len(images)
    skipped = [line for line in stdout.splitlines() if "skipped" in line]
    assert skipped == ["skipped 2 file(s) that Pillow cannot read as images: broken.png, notes.txt"]
    assert "label" not in table and "accuracy" not in inference and not (out / "confusion_matrix.png").exists()
    assert_png(out / "samples.png", 500)

    # The actors' answers are the recipe's prediction (each image and its mirror) on the same 32x32 pixels.
    model = build_model("tiny")
    model.load_state_dict(torch.load(model_pt, weights_only=True))
    pixels = [step06.decode_image(dict(path=path, bytes=Path(path).read_bytes()))[0]["image"] for path in table["path"]]
    with torch.no_grad():
        probabilities = predict(model.eval(), torch.from_numpy(np.stack(pixels)))
    assert table["predicted"].tolist() == probabilities.argmax(1).tolist()
    np.testing.assert_allclose(table["probability"], probabilities.max(1).values.numpy(), rtol=1e-5)


def test_images_with_every_cpu_taken_by_actors_is_refused_rather_than_a_hang(cluster_main_error, tmp_path, fsdp2_run):
    """The actors hold their CPUs for the whole run; the tasks that read the files would never start."""
    write_image_folder(tmp_path / "photos")
    error = cluster_main_error(INFER, "--out", str(tmp_path / "out"), "--images", str(tmp_path / "photos"),
                               "--checkpoint", str(latest_ray_checkpoint(fsdp2_run[1])), "--actors", "2")
    assert error == ("error: --actors 2 would hold all 2 CPUs of the cluster and leave none to read --images; "
                     "use --actors 1")
    assert not (tmp_path / "out").exists()


def red_pixels(path: Path) -> int:
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB")).astype(int)
    return int(((pixels[..., 0] > 200) & (pixels[..., 1] < 60) & (pixels[..., 2] < 60)).sum())


def test_sample_grid_frames_mistakes_in_red_and_only_mistakes(step06, tmp_path):
    gray = np.full((2, 3, 32, 32), 128, dtype=np.uint8)
    rows = pd.DataFrame(dict(label=[3, 5], predicted=[3, 3], predicted_class=["cat", "cat"], probability=[0.9, 0.6]))
    save_sample_grid(gray, rows, ["true: cat", "true: dog"], tmp_path / "one_mistake.png")
    save_sample_grid(gray, rows.assign(label=3), ["true: cat", "true: cat"], tmp_path / "none.png")
    assert red_pixels(tmp_path / "one_mistake.png") > 100 and red_pixels(tmp_path / "none.png") == 0


class WhereTheBarIs(torch.nn.Module):
    """A stand-in model whose answer is the image's orientation: class 0 when its bright half is the top, 1 the bottom,
    2 the left, 3 the right (the other 6 classes never win). Mirror-symmetric left to right, as predict() makes it."""

    def forward(self, x):
        brightness = x.mean(1)  # (N, 32, 32): rows are y, columns x
        halves = [brightness[:, :16].mean((1, 2)), brightness[:, 16:].mean((1, 2)),
                  brightness[:, :, :16].mean((1, 2)), brightness[:, :, 16:].mean((1, 2))]
        return torch.cat([50 * torch.stack(halves, 1), torch.full((len(x), 6), -100.0)], 1)


def bar_image(width=32, height=32, where="top") -> np.ndarray:
    """Black, with a white bar over a quarter of the image along one edge, and a red dot off its axis of symmetry:
    no rotation, flip or transposition leaves it unchanged. (height, width, 3) uint8, as an image file holds it."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    edge = {"top": np.s_[:height // 4], "left": np.s_[:, :width // 4]}[where]
    pixels[edge] = 255
    pixels[height * 3 // 4, width // 8] = (255, 0, 0)
    return pixels


def test_inference_sees_an_image_the_right_way_up_and_round(step06, tmp_path, monkeypatch):
    """The pixels step 06 reads from a file are the image as drawn (rows top to bottom, not transposed), predict()
    averages an image with its left-right mirror only, and the actors pass the pixels to the model unchanged: an image
    whose class is its orientation is classified as itself, never as its transpose or upside-down self."""
    for size in ((32, 32), (64, 48)):  # as it is, and resized
        Image.fromarray(bar_image(*size)).save(tmp_path / "top.png")
        [row] = step06.decode_image(dict(path="top.png", bytes=(tmp_path / "top.png").read_bytes()))
        expected = np.asarray(Image.fromarray(bar_image(*size)).resize((32, 32), Image.Resampling.BILINEAR))
        np.testing.assert_array_equal(row["image"], expected.transpose(2, 0, 1))  # (C, H, W): channels first only
    top = row["image"]
    left = torch.from_numpy(bar_image(where="left")).permute(2, 0, 1).numpy()

    with torch.no_grad():
        probabilities = predict(WhereTheBarIs(), torch.from_numpy(np.stack([top, left])))
    assert probabilities.argmax(1).tolist() == [0, 2] and probabilities[0, 0] > 0.99  # top stays top: mirrored only

    monkeypatch.setattr(step06, "build_model", lambda preset: WhereTheBarIs())
    monkeypatch.setattr(step06.ray, "get", lambda weights: weights)  # the weights themselves, not an object ref
    classify = step06.Classifier("tiny", {}, "cpu")
    answer = classify(dict(image=np.stack([top, left]), path=np.array(["top.png", "left.png"])))
    assert answer["predicted"].tolist() == [0, 2] and answer["path"].tolist() == ["top.png", "left.png"]


def test_a_folder_without_one_image_is_a_one_line_error_before_ray_starts(tmp_path, main_error, monkeypatch):
    forbid_ray(monkeypatch, "for a folder with no image")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    (tmp_path / "photos" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    checkpoint = tmp_path / "model.pt"
    torch.save(build_model("tiny").state_dict(), checkpoint)
    error = main_error(INFER, "--checkpoint", str(checkpoint), "--model", "tiny", "--images", str(tmp_path / "photos"),
                       "--out", str(tmp_path / "out"))
    assert error == (f"error: none of the 2 files in --images {tmp_path / 'photos'} is an image Pillow can read; "
                     f"pass a folder of PNG or JPEG files")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["text", "empty", "tensor", "list", "dict of lists", "checkpoint of a list"])
def test_a_checkpoint_file_that_holds_no_model_is_a_one_line_error_before_ray_starts(content, tmp_path, main_error,
                                                                                    monkeypatch):
    forbid_ray(monkeypatch, "for a file that holds no model")
    monkeypatch.chdir(tmp_path)
    file = Path("not-a-model.pt")  # relative, as typed: Ray would read it as a URI without a scheme
    objects = {"tensor": torch.zeros(3), "list": [1, 2], "dict of lists": {"weight": [1.0]},
               "checkpoint of a list": {"model_preset": "tiny", "model": [1.0]}}
    if content == "text":
        file.write_text("not a checkpoint")
    elif content == "empty":
        file.write_bytes(b"")
    else:
        torch.save(objects[content], file)
    for model in ([], ["--model", "tiny"]):
        error = main_error(INFER, "--checkpoint", str(file), *model, "--data", "synthetic")
        assert error.startswith(f"error: {tmp_path / file} ") and error.endswith(
            "pass a checkpoint.pt, a model.pt or a checkpoint folder"), error


def test_a_relative_checkpoint_path_loads(step06, ray_run, monkeypatch):
    """As the README types it (--checkpoint checkpoints/ray_ddp/RUN_NAME): Ray takes a relative path for a URI, and
    fails on its missing scheme, unless step 06 makes it absolute."""
    storage = ray_run[1]
    run = latest_ray_checkpoint(storage).parent
    monkeypatch.chdir(storage.parent)
    for relative in (Path(storage.name, run.name), Path(storage.name, run.name, latest_ray_checkpoint(storage).name)):
        weights, preset = step06.load_weights(step06.find_checkpoint(relative), None)
        assert preset == "tiny" and weights.keys() == build_model("tiny").state_dict().keys()
