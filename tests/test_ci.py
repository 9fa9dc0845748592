"""CI: the GitHub workflow is valid (actionlint) and runs .ci/run, which runs the README's test command (the README's
tier), then the slow tier in the environment it made, and hands a tier's extra arguments to its pytest, so the
workflow, .ci/run and the README cannot drift apart."""
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def actionlint() -> str:
    """This environment's actionlint (requirements-dev.txt installs it beside python)."""
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert found, "actionlint is not installed: pip install -r requirements-dev.txt"
    return found


def test_the_workflows_pass_actionlint():
    assert WORKFLOWS, "no workflow in .github/workflows"
    result = subprocess.run([actionlint(), *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.upstream
def test_actionlint_finds_a_broken_workflow(tmp_path):
    """actionlint's behaviour that tests/README.md's claim "the workflow is valid (actionlint)" rests on: the check
    above can fail, on a job that needs a job that does not exist, and on an unknown event."""
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text("on: [pushh]\njobs:\n  a:\n    needs: nowhere\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: bash .ci/run\n")
    result = subprocess.run([actionlint(), str(broken)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "pushh" in result.stdout and "nowhere" in result.stdout


def test_the_workflow_runs_the_readmes_tier_on_pushes_and_both_tiers_nightly_through_ci_run():
    [workflow] = [yaml.safe_load(path.read_text()) for path in WORKFLOWS if path.name == "tests.yml"]
    events = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(events)
    commands = {name: [step["run"] for step in job["steps"] if "run" in step] for name, job in workflow["jobs"].items()}
    # Both as root (tests/hosts.py's namespaces; .ci/run's apt-get), with setup-python's PATH.
    assert {name: runs[-1] for name, runs in commands.items()} == {
        "readme-tier": 'sudo env "PATH=$PATH" CI=true bash .ci/run readme',
        "full": 'sudo env "PATH=$PATH" CI=true bash .ci/run'}
    assert "push" in workflow["jobs"]["readme-tier"]["if"] and "schedule" in workflow["jobs"]["full"]["if"]
    for job in workflow["jobs"].values():
        [setup] = [step for step in job["steps"] if step.get("uses", "").startswith("actions/setup-python")]
        assert setup["with"]["cache"] == "pip" and "requirements" in setup["with"]["cache-dependency-path"]
    # The MLflow UI test's browser on the full suite's runner: the one GitHub's images ship, checked before the suite.
    assert commands["full"][-2] == "chromium --version"
    assert workflow["env"]["CI"] == "true"  # a skip fails (suite_rules.py): the UI test must run
    assert not [key for key in workflow["env"] if key.startswith("PIP_")]  # pip's own index for all but torch's two


def test_the_workflow_says_what_each_tier_took_as_tiers_json_measured_it():
    """The workflow's comments on its two jobs quote the last account of both tiers (tests/history/account)."""
    results = json.loads((ROOT / "tests" / "history" / "account" / "tiers.json").read_text())
    readme, slow = results["sessions"]
    text = (ROOT / ".github" / "workflows" / "tests.yml").read_text()
    assert (f"# The README's tier: {readme['tests']} tests, {readme['pytest_seconds'] / 60:.1f} min of pytest "
            f"(tests/history/account/tiers.json)") in text
    assert (f"# Both tiers: {readme['tests'] + slow['tests']} tests, "
            f"{(readme['pytest_seconds'] + slow['pytest_seconds']) / 60:.1f} min of pytest") in text


def test_the_workflow_installs_torch_and_torchvision_alone_from_pytorchs_cpu_index_at_the_pinned_versions():
    """Before .ci/run, into the .venv that the README's command creates again (which keeps what it holds) and completes
    from pip's default index: PyPI's torch would be a multi-GB CUDA build."""
    [workflow] = [yaml.safe_load(path.read_text()) for path in WORKFLOWS if path.name == "tests.yml"]
    for name, job in workflow["jobs"].items():
        runs = [step["run"] for step in job["steps"] if "run" in step]
        [cpu] = [run for run in runs if PYTORCH_CPU in run]
        assert runs.index(cpu) < len(runs) - 1, f"{name}: the CPU wheels come before .ci/run"
        make, install = cpu.strip().splitlines()
        assert make == "python -m venv .venv" and ". .venv/bin/activate" in readme_test_command()
        words, pinned = install.split(" | ")
        assert pinned == f"xargs .venv/bin/pip install --index-url {PYTORCH_CPU}"
        listed = subprocess.run(["bash", "-c", words], cwd=ROOT, capture_output=True, text=True,
                                timeout=30).stdout.split()
        assert [line.split("==")[0] for line in listed] == ["torch", "torchvision"], listed
        assert set(listed) <= set((ROOT / "requirements.txt").read_text().split())


PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"
TEST_ID_RECORDS = {"tests/durations.json", "tests/slow.txt"}  # tests/tiers.py's
# Where an index is named: an option or variable of pip's (its value, on the same line or the next), or an address of
# an index's shape (PyPI's /simple, its file host, PyTorch's wheels, any /simple).
INDEX_OPTION = re.compile(r"(?:--(?:extra-)?index-url|--find-links|-f|PIP_(?:EXTRA_)?INDEX_URL|PIP_FIND_LINKS|"
                          r"(?:extra-)?index-url\s*=)[\s=:]+(\S+)", re.I)
INDEX_ADDRESS = re.compile(r"\w+://[^\s`'\")<>]*(?:/simple\b|pythonhosted\.org|download\.pytorch\.org[\w.]*/whl)"
                           r"[^\s`'\")<>]*", re.I)


def named_indexes(text: str) -> set:
    found = {m.group(1) for m in INDEX_OPTION.finditer(text) if "://" in m.group(1)}
    return {address.rstrip(".,;:`'\")") for address in found | set(INDEX_ADDRESS.findall(text))}  # punctuation


def test_no_package_index_but_pytorchs_cpu_wheels_is_written_anywhere():
    """pip's default index needs no naming; PyTorch's CPU wheels are the one other (the workflow, the README's install
    advice). Every file git tracks, or would add, is read."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=30).stdout.split("\0")
    named = {}
    for name in filter(None, listed):
        if name in TEST_ID_RECORDS or fnmatch.fnmatch(name, "tests/history/account/*.json"):
            continue  # test ids, which quote the commands the docs' tests run (pip's, PyTorch's index cut short)
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # not text, or deleted in the working tree
        for address in named_indexes(text) - {PYTORCH_CPU}:
            if (urllib.parse.urlsplit(address).hostname or "").endswith(".invalid"):  # file:///... has none
                continue  # a name that cannot exist (RFC 2606): the examples of the check's own test, below
            named.setdefault(address, []).append(name)
    assert named == {}
    assert "README.md" in listed and ".github/workflows/tests.yml" in listed


def test_the_index_check_sees_an_index_however_it_is_named():
    assert named_indexes("env:\n  PIP_EXTRA_INDEX_URL: https://pypi.invalid/simple\n") == {"https://pypi.invalid/simple"}
    assert named_indexes("pip install x --extra-index-url\nhttps://a.invalid/pypi") == {"https://a.invalid/pypi"}
    assert named_indexes("[global]\nindex-url = https://b.invalid/pypi\n") == {"https://b.invalid/pypi"}
    assert named_indexes("pip install -f https://c.invalid/wheels x") == {"https://c.invalid/wheels"}
    assert named_indexes("see `https://files.pythonhosted.org.invalid/x.whl`.") == {
        "https://files.pythonhosted.org.invalid/x.whl"}
    assert named_indexes("https://download.pytorch.org.invalid/whl/cu121`") == {
        "https://download.pytorch.org.invalid/whl/cu121"}
    assert named_indexes(f"pip install torch --index-url\n{PYTORCH_CPU}`") == {PYTORCH_CPU}  # the README's
    assert named_indexes("https://pypi.org/project/mlflow/ and -f /opt/wheels, a folder") == set()


@pytest.fixture
def ci_run(tmp_path):
    """.ci/run beside a README whose test command ends in a stand-in `python` that prints CI and its arguments, run on
    a PATH of its own: bash, dirname and sed, stand-ins for Chromium, slurmctld, munged and ip, and an apt-get that
    notes its arguments in apt.log. Returns (the run, apt.log)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text("# x\n\n<!-- test-command -->\n```bash\n"
                                        "python() { echo \"CI=$CI\"; echo \"pytest got:\" \"$@\"; } && "
                                        "python -m pytest -m \"not slow\"\n"
                                        "```\n<!-- /test-command -->\n")
    tools, log = tmp_path / "bin", tmp_path / "apt.log"
    tools.mkdir()
    for tool in ("bash", "dirname", "sed"):
        (tools / tool).symlink_to(shutil.which(tool))
    (tools / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {log}\n')
    (tools / "apt-get").chmod(0o755)
    for tool in ("chromium", "slurmctld", "munged", "ip"):
        (tools / tool).symlink_to(tools / "apt-get")  # any file by that name

    def run(*args):
        return subprocess.run(["bash", str(tmp_path / ".ci" / "run"), *args], env={"PATH": str(tools)},
                              capture_output=True, text=True, timeout=30)
    return run, log


def test_ci_run_runs_the_readmes_tier_then_the_slow_tier_and_hands_a_tiers_arguments_to_its_pytest(ci_run):
    run, _ = ci_run
    both = run()
    assert both.returncode == 0, both.stderr
    assert [line for line in both.stdout.splitlines() if line.startswith("pytest got")] == [
        "pytest got: -m pytest -m not slow", "pytest got: -m pytest -m slow"]
    assert run("readme", "-m", "smoke", "-k", "two words").stdout.splitlines()[-1] == (
        "pytest got: -m pytest -m not slow -m smoke -k two words")
    assert [line for line in run("readme").stdout.splitlines() if line.startswith("pytest got")] == [
        "pytest got: -m pytest -m not slow"]
    assert [line for line in run("slow", "-x").stdout.splitlines() if line.startswith("pytest got")] == [
        "pytest got: -m pytest -m slow -x"]
    wrong = run("fast")
    assert wrong.returncode == 1
    assert wrong.stderr.strip() == "error: no tier 'fast': .ci/run [readme|slow] [PYTEST ARGS]"


def test_a_failed_readme_tier_still_runs_the_slow_tier_and_fails_the_run(ci_run, tmp_path):
    run, _ = ci_run
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace('echo "pytest got:" "$@";', 'echo "pytest got:" "$@"; '
                                                 '[[ "$*" != *"not slow"* ]];'))
    result = run()
    assert result.returncode == 1
    assert [line for line in result.stdout.splitlines() if line.startswith("pytest got")] == [
        "pytest got: -m pytest -m not slow", "pytest got: -m pytest -m slow"]
    assert "error: this tier failed (exit 1)" in result.stderr


def test_ci_run_installs_debians_chromium_where_none_is_installed_and_makes_a_skip_fail(ci_run, tmp_path):
    """With a Chromium on PATH nothing is installed; without one, apt-get installs Debian's. Either way pytest runs
    with CI=true, under which a skip fails (suite_rules.py)."""
    run, log = ci_run
    with_one = run()
    assert with_one.returncode == 0 and not log.exists() and with_one.stdout.splitlines()[-2] == "CI=true"
    (tmp_path / "bin" / "chromium").unlink()
    without = run()
    assert without.returncode == 0, without.stderr
    assert log.read_text().splitlines() == ["apt-get update -q", "apt-get install -y -q chromium"]
    assert without.stdout.splitlines()[-2:] == ["CI=true", "pytest got: -m pytest -m slow"]


def test_ci_run_installs_debians_slurm_munge_and_iproute2_where_missing_in_the_same_apt_get(ci_run, tmp_path):
    run, log = ci_run
    for tool in ("chromium", "slurmctld", "munged", "ip"):
        (tmp_path / "bin" / tool).unlink()
    assert run().returncode == 0
    assert log.read_text().splitlines() == ["apt-get update -q",
                                            "apt-get install -y -q chromium slurm-wlm munge iproute2"]


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    [command] = [line for line in block.splitlines() if line and not line.startswith(("<", "`"))]
    return command


def test_the_readmes_test_command_ends_with_its_tiers_pytest_so_arguments_reach_it():
    assert readme_test_command().endswith(' && python -m pytest -m "not slow"')
