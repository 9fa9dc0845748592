"""The room's commands on a laptop with one NVIDIA GPU (tests/one_gpu/: a GPU faked where the hardware answers).
Two processes or workers on one GPU are refused, one line each, by the steps' checks; so each your-turn slide and the
handout say to hide the GPU first (`export CUDA_VISIBLE_DEVICES=`), and with it every command the room runs trains
on the CPUs, as on a laptop without a GPU, and prints the same numbers."""
import os
import re
import shlex
import sys
from collections import Counter
from pathlib import Path

import pytest

from processes import ROOT, run

sys.path.insert(0, str(ROOT / "slides"))
import rehearse  # noqa: E402

FAKE_ONE_GPU = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "one_gpu"),
                                                            os.environ.get("PYTHONPATH")]))}
HIDE = "export CUDA_VISIBLE_DEVICES="
RUNS = [(title, command) for title, command in rehearse.REHEARSAL if not command.startswith("diff")]


def extended(command: str) -> bool:
    """Whether another of the room's runs has this one's words and more: it runs what this one runs (step 02's crash
    and restart runs its plain run's script with its flags), so this one proves nothing more."""
    words = Counter(command.split())
    return any(other != command and words <= Counter(other.split()) for _, other in RUNS)


ROOM = [(title, command) for title, command in RUNS if not extended(command)]
# Each run cut to its first steps: the checks under test run before the first step.
CUT = {"batch_inference.py": ["--eval-images", "64"]}
CUT_TRAINING = ["--model", "tiny", "--steps-per-epoch", "2", "--eval-images", "64"]
ROOM_RUN_S = 240  # each of the room's runs, Ray's start included, on a laptop's two cores shared with the suite


def as_test_runs(command: str, work: Path) -> list:
    """The room's command as the rehearsal runs it (synthetic data, its own folders), cut, with this Python; torchrun
    on a free port (the suite's other runs use the default one)."""
    from common.rendezvous import free_port
    words = rehearse.as_run(command, work, data_dir=None)
    words += CUT.get(Path(rehearse.script_of(words)).name, CUT_TRAINING)
    if words[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--master-port", str(free_port()), *words[1:]]
    return [sys.executable, *words[1:]]


def test_the_fake_gpu_is_what_the_steps_checks_see():
    """Without hiding it, the fake GPU refuses what a real one refuses: a test of the fake, and why the slides say
    to hide it."""
    torchrun = next(command for _, command in RUNS if command.startswith("torchrun"))
    refused = run(as_test_runs(torchrun, Path("/nonexistent-never-written")), env=FAKE_ONE_GPU, timeout=120)
    assert refused.returncode != 0 and "--nproc_per_node 2 is more than this node's 1 GPU(s)" in refused.stderr, \
        refused.stderr[-3000:]


def test_two_ray_workers_on_the_fake_gpu_are_refused_in_one_line(tmp_path):
    step02 = next(command for _, command in RUNS if "train_ray_ddp.py" in command)
    refused = run(as_test_runs(step02, tmp_path), env=FAKE_ONE_GPU, timeout=180)
    assert refused.returncode != 0 and "--num-workers 2 needs 2 GPUs, the cluster has 1" in refused.stderr, \
        refused.stderr[-3000:]


def test_every_slide_the_room_runs_and_the_handout_say_how_to_hide_the_gpu():
    """Each your-turn slide, and each slide that shows a command the room runs (the baseline's too: a GPU's run
    prints other numbers than the comparison with it that follows); not those the instructor runs from the notes."""
    shown = {(title, rehearse.script_of(command.split())) for title, command in RUNS}
    slides = [slide for slide in rehearse.parse_deck(rehearse.DECK.read_text())
              if slide.title.startswith("Your turn")
              or any(title == slide.title and script in re.sub(r"<!--.*?-->", "", slide.text, flags=re.DOTALL)
                     for title, script in shown)]
    assert len(slides) >= 6
    for slide in slides:
        assert HIDE in slide.text, f"slide {slide.number} ({slide.title}): say `{HIDE}` for a laptop with a GPU"
    assert HIDE in (ROOT / "slides" / "handout.md").read_text()


@pytest.mark.timeout(len(ROOM) * ROOM_RUN_S)  # the room's runs one after the other, each with its own limit
def test_every_command_of_the_room_trains_on_the_cpus_with_the_gpu_hidden(tmp_path):
    """The room's commands in the talk's order (step 06 reads step 02's checkpoint), each accepted, on CPUs; a run
    that another extends, through that one."""
    for title, command in ROOM:
        done = run(as_test_runs(command, tmp_path), env={**FAKE_ONE_GPU, "CUDA_VISIBLE_DEVICES": ""},
                   timeout=ROOM_RUN_S)
        assert done.returncode == 0, f"{title}: {shlex.join(done.args)}\n{done.stderr[-3000:]}"
        placed = re.findall(r"\b\d+ (?:actor\(s\) )?x ([a-z]+)\b", done.stdout + done.stderr)  # "2 x cpu on 1 node(s)"
        assert placed and set(placed) == {"cpu"}, f"{title}: its runs went to {placed or 'nowhere it printed'}"
