"""The suite's two tiers (tiers.py): the README's command and the slow tier's, as .ci/run runs them, collect the
whole suite between them and no test twice; the slow list is what the published durations decide; the rule keeps
what it must and counts a shared run once."""
import re
import shlex
import subprocess
import sys

import tiers
from conftest import ROOT
from test_ci import readme_test_command


def collect(*pytest_args) -> tuple[list[str], int]:
    """The ids a pytest command selects, and how many tests the suite has."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             *pytest_args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    counted = re.search(r"(?:(\d+)/)?(\d+) tests? collected", result.stdout)
    return ids, int(counted[2])


def ci_run_slow_tier() -> list[str]:
    """The slow tier's pytest arguments, as .ci/run writes its command."""
    [line] = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("slow_tier=")]
    return shlex.split(line.split("=", 1)[1].strip('"').replace("$pytest_call", ""))


def test_the_two_tiers_collect_the_whole_suite_between_them_and_no_test_twice():
    """Under CI=true a test in neither tier would be a test nobody runs: the README's command and .ci/run's slow tier,
    collected as they run, hold every test of the suite once; every id of slow.txt names a test."""
    readme = shlex.split(readme_test_command().rsplit("python -m pytest", 1)[1])
    fast, whole = collect(*readme)
    slow, whole_again = collect(*ci_run_slow_tier())
    assert whole == whole_again
    assert not set(fast) & set(slow), "a test in both tiers"
    assert len(set(fast)) + len(set(slow)) == whole, f"{whole - len(fast) - len(slow)} tests in neither tier"
    assert sorted(slow) == sorted(tiers.slow_ids()), "slow.txt names a test the suite does not have"


def test_the_slow_list_is_what_the_published_durations_decide():
    result = subprocess.run([sys.executable, "tests/tiers.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rule_keeps_the_required_tests_counts_a_shared_run_once_and_the_early_lane_beside(monkeypatch):
    """A smoke run that costs more than the budget alone stays; two cheap tests share a run that counts once, and one
    of them an early run that runs beside the main lane; one test costs more than the rest could leave it; a test
    with no recorded duration stays; a run set up inside a test (asked for by name) is one it needs."""
    monkeypatch.setattr(tiers, "BUDGET", 100)
    tests = {"smoke": dict(function="a", smoke=True, shared=[]),
             "one": dict(function="b", smoke=False, shared=["run"]),
             "two": dict(function="c", smoke=False, shared=["run", "early:queue_run"]),
             "dear": dict(function="d", smoke=False, shared=[]),
             "by_name": dict(function="f", smoke=False, shared=[]),
             "new": dict(function="e", smoke=False, shared=["run"])}
    durations = dict(overhead_seconds=10.0, shared={"run": dict(seconds=30.0), "other": dict(seconds=60.0)},
                     early={"queue_run": dict(seconds=35.0)},
                     tests={"smoke": dict(seconds=20.0), "one": dict(seconds=5.0), "two": dict(seconds=5.0),
                            "dear": dict(seconds=55.0), "by_name": dict(seconds=1.0, sets_up=["other"])})
    fast, threshold, total = tiers.readme_tier(tests, durations)
    # 10 + the main lane (smoke 20 + run 30 + one 5 + two 5 = 60; the early lane's 35 beside it, not after) = 70;
    # dear's 55 or by_name's run of 60 would pass 100; new is unrecorded
    assert fast == {"smoke", "one", "two", "new"} and total == 70
    monkeypatch.setattr(tiers, "BUDGET", 20)
    assert tiers.readme_tier(tests, durations)[0] == {"smoke", "new"}  # required, and unrecorded
