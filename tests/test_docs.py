"""What the documents tell an attendee to paste, and what they say it prints, is true of the scripts.

- Every command in a fenced bash block of the READMEs, TROUBLESHOOTING.md, the slides and the handout names a
  script (or a module of this repository, `python -m labs.check 01`) that exists, with flags that its own parser
  accepts (parsed by it, its checks skipped: placeholders such as DIR stand for the attendee's folders). A shell
  launcher's flags are its case labels.
- Every command is safe to paste on an attendee's machine: no path into this repository's offline copy of
  CIFAR-10, no flag value meaningful only for it, no output into benchmarks/published/ (benchmarks/README.md's
  maintainer section excepted).
- Every torchrun, `ray` and `mlflow` command takes the options it is shown with (torchrun's own parser, Ray's and
  MLflow's click commands).
- Every command that runs longer than its step's minutes in README.md's path table says so: a trailing comment,
  `# about N min`, within a fifth of what the published measurements (benchmarks/published/steps/results.json:
  the run's start-up, images/s and evaluation time) make of its epochs and steps. The install and the test
  commands state their cost beside them.
- No document names an environment variable as Ray's that Ray does not read: every `RAY_...` name is in Ray's
  installed sources or binaries, or its sentence says which of the workshop's files reads it.
- TROUBLESHOOTING.md's contents list is its headings, in order.
- Every `diff -u OLD NEW` the documents name compares two files that exist.
- Every "what you'll see" block (a ```text block right after `<!-- output: SCRIPT -->`) is what SCRIPT prints:
  each line is one that a print of the script or of common/ can produce (matched against the f-strings in their
  source), a progress bar, or the JSON summary with keys the script writes, in its order.
"""
import argparse
import ast
import glob
import json
import re
from pathlib import Path

import pytest

from benchmarks.record import evaluation_seconds, steady_images_per_s
from common.meter import HEADLINE
from conftest import ROOT, parse_only

DOCUMENTS = sorted({p for pattern in ("README.md", "0*/README.md", "TROUBLESHOOTING.md", "tests/README.md",
                                      "benchmarks/README.md", "labs/README.md", "slides/README.md",
                                      "slides/workshop.md", "slides/handout.md")
                    for p in ROOT.glob(pattern)})
MAINTAINERS = "## Maintainers"  # benchmarks/README.md's section that may write into benchmarks/published/
UNSAFE = ["../shared", "shared/data", "--eval-images 1017", "--out benchmarks/published"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(document: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(document.read_text()) if kind == lang]


def commands(block: str) -> list[list[str]]:
    """The commands of a bash block, continuations joined, comments dropped, split at && ; |."""
    joined = block.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            found += [part.split() for part in re.split(r"&&|;|\|", line) if part.strip()]
    return found


def script_commands():
    for document in DOCUMENTS:
        for block in blocks(document, "bash"):
            for words in commands(block):
                if words[0] in ("diff", "git", "cat", "ls", "cd"):  # they name files, not a script to run
                    continue
                for i, word in enumerate(words):
                    module = words[i + 1] if word == "-m" and i + 1 < len(words) else ""
                    if module and (ROOT / f"{module.replace('.', '/')}.py").is_file():  # python -m labs.check 01
                        word = f"{module.replace('.', '/')}.py"
                    if word.endswith((".py", ".sh")) and "/" in word:
                        yield pytest.param(document, word, words[i + 1 + bool(module):],
                                           id=f"{document.relative_to(ROOT)}: {' '.join(words)[:70]}")
                        break


@pytest.mark.parametrize("document, script, flags", list(script_commands()))
def test_every_pasted_command_runs_a_script_with_flags_it_accepts(document, script, flags, monkeypatch, capsys):
    found = glob.glob(script, root_dir=ROOT)
    assert len(found) == 1 and (ROOT / found[0]).is_file(), f"{document.name}: no script {script}"
    path = ROOT / found[0]
    if path.suffix == ".sh":
        labels = set(re.findall(r"^\s*([-\w|]+)\)", path.read_text(), re.M))
        accepted = {flag for label in labels for flag in label.split("|")}
        for flag in [f for f in flags if f.startswith("--") and f != "--"]:
            assert flag.split("=")[0] in accepted or "--" in flags[:flags.index(flag)], f"{path.name}: no {flag}"
        return
    monkeypatch.syspath_prepend(str(path.parent))  # the benchmarks import each other
    try:
        parse_only(found[0], *flags, check=False)  # parsed: every flag exists and takes its value
    except SystemExit:
        pytest.fail(f"{document.name}: {path.name} {' '.join(flags)}: {capsys.readouterr().err}")


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_is_safe_to_paste_on_an_attendees_machine(document):
    text = document.read_text()
    if document == ROOT / "benchmarks/README.md" and MAINTAINERS in text:
        text = text.split(MAINTAINERS)[0]
    assert [unsafe for unsafe in UNSAFE if unsafe in text] == []


# --- launchers: torchrun, ray, mlflow ------------------------------------------------------------------------

def launcher_commands():
    for document in DOCUMENTS:
        for block in blocks(document, "bash"):
            for words in commands(block):
                if words[0] in ("torchrun", "ray", "mlflow"):
                    yield pytest.param(words, id=f"{document.relative_to(ROOT)}: {' '.join(words)[:70]}")


def click_accepts(group, words: list[str]):
    """Parses words with the click group's command (no callback runs); raises click's error for a bad option."""
    import click

    command = group.get_command(click.Context(group), words[0])
    assert command is not None, f"no command {words[0]}"
    command.make_context(words[0], list(words[1:]))


@pytest.mark.parametrize("words", list(launcher_commands()))
def test_every_launcher_command_takes_its_options(words):
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        script = next(i for i, w in enumerate(words) if w.endswith(".py"))
        get_args_parser().parse_args(words[1:script + 1])  # exits with a usage error on an unknown option
    elif words[0] == "ray":
        from ray.scripts.scripts import cli

        click_accepts(cli, words[1:])
    else:
        from mlflow.cli import cli

        click_accepts(cli, words[1:])


def test_the_launcher_check_tells_a_bad_option_apart():
    import click
    from ray.scripts.scripts import cli
    from torch.distributed.run import get_args_parser

    with pytest.raises(click.exceptions.NoSuchOption):
        click_accepts(cli, ["start", "--heads"])
    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--max-retries", "3", "train_ddp.py"])


# --- what a command costs ---------------------------------------------------------------------------------------

STEPS_RESULTS = json.loads((ROOT / "benchmarks/published/steps/results.json").read_text())
PUBLISHED = {run["name"]: run for run in STEPS_RESULTS["runs"] if run["status"] == "ok"}
STATED = re.compile(r"#.*\babout (\d+) min\b")
VALIDATION_IMAGES, TEST_IMAGES = 5_000, 10_000


def step_minutes() -> dict:
    """README.md's path table: the minutes of each step, the largest where a step runs two commands (01)."""
    rows = re.findall(r"^\| \[(\d\d)\]\(.*?\) \| .*? \| ([\d min+]+) \|", (ROOT / "README.md").read_text(), re.M)
    return {step: max(int(m) for m in re.findall(r"\d+", cell)) for step, cell in rows}


def the_published_run(script: str, flags: argparse.Namespace, launcher: str) -> str | None:
    """The run of the steps benchmark that this command repeats, up to its epochs and steps."""
    name = Path(script).name
    if name == "train_ray_ddp.py" and flags.num_workers == 0:
        return "ray_ddp_local_torchrun" if launcher == "torchrun" else "ray_ddp_local"
    if name == "train_ray_ddp.py" and flags.num_workers == 1:
        return "ray_ddp_1_worker"
    if name == "train_ray_fsdp2.py" and flags.mixed_precision:
        return "ray_fsdp2_mp_offload"
    return {"train_single_machine.py": "single_machine", "train_ddp.py": "ddp", "train_ray_ddp.py": "ray_ddp",
            "train_ray_ddp_with_mlflow.py": "ray_ddp", "train_ray_ddp_with_ray_data.py": "ray_ddp_data",
            "train_ray_fsdp.py": "ray_fsdp", "train_ray_fsdp2.py": "ray_fsdp2",
            "tune_ray_ddp.py": "ray_tune"}.get(name)


def epoch_seconds(run: dict, steps: int, images_evaluated: int) -> float:
    """One epoch of a published run at `steps` steps: its training at the run's steady images/s, and its evaluation
    (the rest of the run's wall time per epoch after its start-up and its training), scaled to the images
    evaluated."""
    batch, ips = run["summary"]["global_batch_size"], steady_images_per_s(run["summary"])
    return steps * batch / ips + evaluation_seconds(run) * images_evaluated / TEST_IMAGES


def estimated_minutes(script: str, words: list[str], launcher: str) -> float | None:
    """What the published measurements make of a command on the benchmark's 2 cores; None where they cannot say:
    another model or data, a cluster (--address), a run resumed from somewhere, torchrun restarting it."""
    p = argparse.ArgumentParser(add_help=False)
    for flag, kind in [("--epochs", int), ("--steps-per-epoch", int), ("--num-workers", str),
                       ("--num-samples", int), ("--fail-at-epoch", int), ("--batch-size", int),
                       ("--model", str), ("--data", str), ("--address", str), ("--eval-images", int)]:
        p.add_argument(flag, type=kind)
    for flag in ("--resume", "--mixed-precision"):
        p.add_argument(flag, action="store_true")
    flags, _ = p.parse_known_args(words)
    if flags.num_workers is not None:  # a range, MIN-MAX, is an elastic run: none was published
        flags.num_workers = int(flags.num_workers) if flags.num_workers.isdigit() else -1
    name = the_published_run(script, flags, launcher)
    if (name is None or name not in PUBLISHED or flags.model not in (None, "hybrid") or flags.address
            or flags.resume or flags.batch_size not in (None, 128) or flags.eval_images
            or (launcher == "torchrun" and "--max-restarts" in " ".join(words))):
        return None
    epochs = flags.epochs or 10
    if name == "ray_tune":  # the benchmark's sweep, with more or longer trials: 1-worker trials, two at a time
        if flags.data not in (None, "cifar10-val") or flags.num_workers != 1:
            return None
        measured = PUBLISHED[name]
        base = dict(zip(measured["flags"][::2], measured["flags"][1::2], strict=True))
        trial = PUBLISHED["ray_ddp_1_worker"]
        steps = flags.steps_per_epoch or (45_000 // 128)
        more = ((flags.num_samples or 8) * epochs * epoch_seconds(trial, steps, VALIDATION_IMAGES)
                - int(base["--num-samples"]) * int(base["--epochs"])
                * epoch_seconds(trial, int(base["--steps-per-epoch"]), VALIDATION_IMAGES))
        return (measured["wall_s"] + more / 2) / 60
    if flags.data not in (None, "cifar10"):
        return None
    run = PUBLISHED[name]
    if launcher == "torchrun" and flags.fail_at_epoch:
        epochs = flags.fail_at_epoch  # the crash ends the run: torchrun restarts nothing unless told to
    restarts = 1 if flags.fail_at_epoch and launcher != "torchrun" else 0  # Ray restarts the worker group once
    start = run["launch_to_first_step_s"]
    seconds = start + epochs * epoch_seconds(run, flags.steps_per_epoch or 50_000 // 128, TEST_IMAGES)
    return (seconds + restarts * (start - run["imports_s"])) / 60


def step_of(script: str) -> str | None:
    folder = Path(script).parts[0]
    return folder[:2] if re.fullmatch(r"0\d-.*", folder) else None


def costed_commands():
    """(document, command, its trailing comment, launcher) for every command of the attendees' documents that
    runs a step's script."""
    for document in DOCUMENTS:
        if document.parent.name in ("slides", "benchmarks", "tests"):
            continue  # the maintainers' and the deck's
        for block in blocks(document, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                command, _, comment = line.partition(" #")
                for part in re.split(r"&&|;|\|", command):
                    words = part.split()
                    if not words or words[0] in ("diff", "git", "cat", "ls", "cd"):  # they name files
                        continue
                    scripts = [i for i, w in enumerate(words) if re.fullmatch(r"0\d-[\w-]+/\w+\.py", w)]
                    if scripts:
                        yield document, words[scripts[0]], words[scripts[0] + 1:], comment, words[0]


@pytest.mark.parametrize("document, script, words, comment, launcher", [
    pytest.param(*c, id=f"{c[0].relative_to(ROOT)}: {c[1]} {' '.join(c[2])}"[:100]) for c in costed_commands()])
def test_a_command_longer_than_its_step_states_what_the_measurements_make_of_it(document, script, words, comment,
                                                                                 launcher):
    estimate = estimated_minutes(script, words, launcher)
    document = document.relative_to(ROOT)
    stated = STATED.search("#" + comment)
    if estimate is not None and estimate > step_minutes()[step_of(script)] + 1:
        assert stated, (f"{document}: {script} {' '.join(words)} runs about {estimate:.0f} min on 2 cores, more "
                        f"than step {step_of(script)}'s {step_minutes()[step_of(script)]} min: end its line with "
                        f"'# about {estimate:.0f} min'")
    if stated and estimate is not None:
        assert abs(int(stated.group(1)) - estimate) <= max(2, estimate / 5), (
            f"{document}: {script} {' '.join(words)} says about {stated.group(1)} min; the published "
            f"measurements make it {estimate:.0f} min")


def test_the_estimate_is_the_path_tables_for_one_epoch_and_grows_with_the_work():
    """One epoch of a step is what README.md's path table says (both from the same runs); more epochs, a slower
    configuration or a longer sweep cost more."""
    minutes = step_minutes()
    for script, step in [("01-vanilla-pytorch-ddp/train_single_machine.py", "01"),
                         ("02-ray-train-ddp/train_ray_ddp.py", "02"), ("03-ray-train-fsdp/train_ray_fsdp.py", "03"),
                         ("04-ray-train-fsdp2/train_ray_fsdp2.py", "04")]:
        assert minutes[step] - 1 < estimated_minutes(script, ["--epochs", "1"], "python") <= minutes[step], script
    fsdp2 = "04-ray-train-fsdp2/train_ray_fsdp2.py"
    bf16 = argparse.Namespace(num_workers=2, mixed_precision=True)  # costed from its own run: bf16's pace is the CPU's
    assert the_published_run(fsdp2, bf16, "python") == "ray_fsdp2_mp_offload"
    assert estimated_minutes(fsdp2, ["--epochs", "3"], "python") > 2.5 * estimated_minutes(fsdp2, ["--epochs", "1"],
                                                                                           "python")
    tune = "05-ray-tune/tune_ray_ddp.py"
    sweep = ["--num-workers", "1", "--num-samples", "4", "--steps-per-epoch", "50", "--epochs"]
    assert minutes["05"] - 1 < estimated_minutes(tune, [*sweep, "1"], "python") <= minutes["05"]
    assert estimated_minutes(tune, [*sweep, "2"], "python") > 1.4 * estimated_minutes(tune, [*sweep, "1"], "python")
    assert estimated_minutes(fsdp2, ["--model", "giant"], "python") is None
    assert STATED.search("# about 65 min, 1.4 GB").group(1) == "65" and not STATED.search("about 65 min")


def test_the_readme_stays_a_guide_of_at_most_250_lines():
    """The attendee's guide; the depth goes to each step's README (it had grown back to 256 lines, #52)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_install_and_the_test_commands_state_their_cost():
    start = (ROOT / "README.md").read_text().split("## Start here")[1].split("\n## ")[0]
    assert re.search(r"downloads about [\d.]+ GB and takes [\d.]+ GB of disk", start), "install: its size"
    assert re.search(r"\d+ s on a .*2-core machine", start), "install: how long it took"
    # Without an NVIDIA GPU: one block, in the order that keeps the CUDA libraries out (the CPU wheels, in the venv,
    # before the requirements that would pull PyPI's torch).
    cpu_wheels = re.escape("https://download.pytorch.org/whl/cpu")
    assert re.search(r"```bash\npython3 -m venv \.venv && \. \.venv/bin/activate\n"
                     rf"pip install torch==\S+ torchvision==\S+ --index-url {cpu_wheels}\n"
                     r"pip install -r requirements\.txt", start), "install: PyTorch's CPU wheels, in one block"
    # how long each tier takes: rendered from tests/history/account/tiers.json (test_tables.py)
    assert re.search(r"<!-- table: suite-tiers -->\nThe README's tier, below: \d+ tests in [\d.]+ min", start)


# --- Ray's environment variables, and TROUBLESHOOTING.md's contents ----------------------------------------------

def ray_reads() -> str:
    """The text of Ray's installed Python sources and of its compiled core (where the RAY_<config> names live)."""
    import ray

    package = Path(ray.__file__).parent
    texts = [p.read_text(errors="ignore") for p in package.rglob("*.py")]
    for binary in ("_raylet.so", "core/src/ray/raylet/raylet", "core/src/ray/gcs/gcs_server"):
        if (package / binary).is_file():
            texts.append((package / binary).read_bytes().decode("latin-1"))
    return "\n".join(texts)


RAY_NAME = re.compile(r"\bRAY_[A-Za-z0-9_]+")
OURS = re.compile(r"the steps read|common/\w+\.py|0\d-[\w-]+/\w+\.py")


def named_as_rays(text: str, ray_text: str) -> list[str]:
    """The RAY_ names that Ray does not read, named in a sentence that does not say which of our files reads it."""
    wrong = []
    for paragraph in re.split(r"\n\s*\n|\n- ", text):
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", " ".join(paragraph.split())):
            for name in set(RAY_NAME.findall(sentence)):
                if name not in ray_text and not OURS.search(sentence):
                    wrong.append(name)
    return wrong


def test_no_document_names_an_environment_variable_as_rays_that_ray_does_not_read():
    ray_text = ray_reads()
    wrong = {str(d.relative_to(ROOT)): named_as_rays(d.read_text(), ray_text) for d in DOCUMENTS}
    assert {d: names for d, names in wrong.items() if names} == {}
    # and the check tells them apart: Ray's own, ours attributed, ours presented as Ray's
    assert named_as_rays("Set `RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`.", ray_text) == []
    assert named_as_rays("Set `RAY_memory_usage_threshold`.", ray_text) == []  # read by the raylet (C++)
    assert named_as_rays("The steps read `RAY_TRAIN_ELASTIC_MONITOR_INTERVAL_S` (`common/ray_setup.py`).",
                         ray_text) == []
    assert named_as_rays("Shorten `RAY_TRAIN_ELASTIC_MONITOR_INTERVAL_S` (60 s).", ray_text) == \
        ["RAY_TRAIN_ELASTIC_MONITOR_INTERVAL_S"]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_troubleshootings_contents_list_is_its_headings_in_order():
    text = (ROOT / "TROUBLESHOOTING.md").read_text()
    listed = re.findall(r"^- \[(.+?)\]\(#([\w-]+)\)", text.split("\n### ")[0], re.M)
    headings = re.findall(r"^### (.+)$", text, re.M)
    assert [target for _, target in listed] == [anchor(h) for h in headings]
    assert [title for title, _ in listed] == headings


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_diff_compares_files_that_exist(document):
    for old, new in re.findall(r"diff -u ([^\s`]+) ([^\s`]+)", document.read_text()):
        if old.isupper():  # diff -u OLD NEW: the form, not a pair
            continue
        for path in (old, new):
            assert len(glob.glob(path, root_dir=ROOT)) == 1, f"{document.name}: diff -u names {path}"


# --- "what you'll see" ------------------------------------------------------------------------------------------

OUTPUT = re.compile(r"<!-- output: (\S+) -->\n```text\n(.*?)^```", re.M | re.S)
RAY_PREFIX = re.compile(r"^\((?:\w+ )?pid=\d+(?:, ip=[\d.]+)?\) ")
PROGRESS = re.compile(r"^epoch \d+: +\d+%\|.*\| [\d.]+/[\d.]+ \[")


def printed_patterns(path: Path) -> list[re.Pattern]:
    """A regular expression for every f-string and string constant in the file: its text, with any value where
    the f-string formats one. Strings with little text of their own (at most 8 characters) are left out: they
    would match nearly anything."""
    patterns = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".+?" for v in node.values]
            literal = sum(len(v.value) for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts, literal = [re.escape(node.value)], len(node.value)
        else:
            continue
        if literal > 8:
            patterns.append(re.compile("".join(parts)))
    return patterns


def summary_keys(path: Path) -> list[str]:
    """The keys of the JSON line a script prints last: common.meter's headline for steps 01-04 (print_run_summary),
    else the keywords of the script's dict(step=...) calls, in order."""
    if "print_run_summary(" in path.read_text():
        return [*HEADLINE, "summary"]

    def keys_in(source: Path) -> list[str]:
        keys = []
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict" and \
                    any(k.arg == "step" for k in node.keywords):
                keys += [k.arg for k in node.keywords if k.arg]
        return keys
    return keys_in(path) or [key for source in sorted((ROOT / "common").glob("*.py")) for key in keys_in(source)]


def quoted_outputs():
    for document in DOCUMENTS:
        for script, body in OUTPUT.findall(document.read_text()):
            yield pytest.param(script, body.splitlines(), id=f"{document.relative_to(ROOT)}: {script}")


def line_problem(line: str, patterns: list, keys: list):
    line = RAY_PREFIX.sub("", line)
    if line.strip() in ("", "...") or PROGRESS.match(line):
        return None
    if line.startswith("{"):
        shown = re.findall(r'"(\w+)":', line)
        in_order = [key for key in keys if key in shown]
        return None if shown and shown == in_order[:len(shown)] else f"JSON keys {shown} not in the order {keys}"
    if any(p.fullmatch(line) for p in patterns):
        return None
    # A line cut short with "..." shows the start of a printed line.
    if line.endswith("...") and any(p.match(line[:-3].rstrip(", ")) for p in patterns):
        return None
    return "no print of the script or of common/ makes this line"


@pytest.mark.parametrize("script, lines", list(quoted_outputs()))
def test_what_youll_see_is_what_the_script_prints(script, lines):
    path = ROOT / script
    patterns = [p for source in [path, *sorted((ROOT / "common").glob("*.py"))] for p in printed_patterns(source)]
    problems = [(line, why) for line in lines if (why := line_problem(line, patterns, summary_keys(path)))]
    assert problems == [], f"{script}: lines that it does not print: {problems}"


def test_the_output_check_tells_a_changed_format_apart():
    path = ROOT / "01-vanilla-pytorch-ddp/train_ddp.py"
    patterns = [p for source in [path, ROOT / "common/reporting.py"] for p in printed_patterns(source)]
    keys = summary_keys(path)
    epoch = "epoch 1/1 | 2 processes | train loss 1.7735 | test acc 47.86% | 262.0 s | 191 img/s | peak mem 1,554 MB"
    assert line_problem(epoch, patterns, keys) is None
    assert line_problem(epoch.replace("2 processes", "1 process"), patterns, keys) is None
    assert line_problem(epoch.replace("train loss", "loss"), patterns, keys)
    assert line_problem('{"step": "ddp", "world_size": 2, ...}', patterns, keys) is None
    assert line_problem('{"world_size": 2, "step": "ddp"}', patterns, keys)
    assert line_problem('{"step": "ddp", "world_size": 2, "device": "cpu", ...}', patterns, keys)  # the summary's
    assert line_problem("memory per rank (MB) | parameters | gradients | optimizer state | peak", patterns, keys) \
        is None
    assert line_problem("epoch 1: 100%|████| 390/390 [04:29<00:00, 1.45it/s]", patterns, keys) is None
