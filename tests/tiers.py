"""The suite's two tiers: the README's (`python -m pytest -m "not slow"`: what a newcomer and every change run) and the
slow one (`python -m pytest -m slow`: nightly, and in .ci/run after the README's). A test is in the slow tier when its
id is in tests/slow.txt; this file marks it so (a plugin: conftest.py's pytest_plugins). As a script, it decides the
list from the published durations (tests/durations.json, written by tests/history/account/account.py), not by feel:

    python tests/tiers.py            # the tests that belong in the other tier, by the published durations
    python tests/tiers.py --write    # and rewrite tests/slow.txt so

The rule: each test costs its recorded duration (its own seconds, the shared runs set up in it apart) plus an even
share of each shared run it needs (a session- or module-scoped fixture, an early run), among all the suite's tests
that need it. The README's tier holds the tests that must stay (REQUIRED: every step end to end, every lab's untouched
file and solution) and every other test that costs at most T, T the largest cost at which the tier's duration stays
within BUDGET: the session's overhead plus the longer of its two lanes, the main one (its tests and the shared runs
they need) and the early one (its early runs, which run beside). A shared run it needs is one
that it asks for (its fixtures) or that was set up during it (asked for by name, request.getfixturevalue). A test
with no recorded duration stays in the README's tier, and the script names it."""
import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SLOW_LIST, DURATIONS = HERE / "slow.txt", HERE / "durations.json"
# The README's tier, in seconds as the published durations count them (each test's own, measured in a whole run beside
# the early lane): 10 minutes of pytest on 2 cores less a quarter for how much one kind of machine swings (the same
# suite took 41 to 61 min on AMD EPYC Zen 4s within a week). The durations were published on the slowest machine seen.
BUDGET = 450
# Tests whose proof the README's tier must carry, whatever they cost: every script end to end (the smoke tier), and
# every lab's check on its untouched file and on its solution.
REQUIRED_TESTS = ("test_every_check_fails_on_the_untouched_lab_for_its_lesson",
                  "test_every_check_passes_on_the_solution")


def required(test: dict) -> bool:
    return test["smoke"] or test["function"] in REQUIRED_TESTS


def slow_ids() -> set[str]:
    lines = SLOW_LIST.read_text().splitlines() if SLOW_LIST.exists() else []
    return {line for line in lines if line and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    slow = slow_ids()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


def collected() -> dict:
    """{test id: its function, smoke marker and shared runs}, from a collection of the whole suite in a new process."""
    code = ("import json, sys, pytest\n"
            "class Collect:\n"
            "    def pytest_collection_finish(self, session):\n"
            "        self.tests = {item.nodeid: dict(function=item.originalname, shared=shared(item),\n"
            "                      smoke=item.get_closest_marker('smoke') is not None) for item in session.items}\n"
            "def shared(item):\n"
            "    names = [name for name, defs in item._fixtureinfo.name2fixturedefs.items()\n"
            "             if defs[-1].scope in ('session', 'package', 'module')]\n"
            "    early = item.get_closest_marker('early')\n"
            "    return names + ([f\"early:{early.kwargs['run'].__name__}\"] if early else [])\n"
            "plugin = Collect()\n"
            "code = pytest.main(['--collect-only', '-qq', '-p', 'no:cacheprovider'], plugins=[plugin])\n"
            "print('\\n' + json.dumps(plugin.tests))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=HERE.parent, capture_output=True, text=True,
                            timeout=300)
    if result.returncode:
        raise SystemExit(f"error: the suite did not collect: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def costs(tests: dict, durations: dict) -> tuple[dict, dict]:
    """Each shared run's seconds, and each recorded test's own."""
    shared = {name: run["seconds"] for name, run in durations["shared"].items()}
    shared |= {f"early:{name}": run["seconds"] for name, run in durations["early"].items()}
    return shared, {test: durations["tests"][test]["seconds"] for test in tests if test in durations["tests"]}


def needs(test: str, info: dict, durations: dict) -> set:
    """The shared runs a test asks for, and those set up during it (asked for by name)."""
    return set(info["shared"]) | set(durations["tests"].get(test, {}).get("sets_up", []))


def readme_tier(tests: dict, durations: dict) -> tuple[set, float, float]:
    """The README's tier by the rule above: (its ids, T, its predicted seconds)."""
    shared, own = costs(tests, durations)
    needed = {test: needs(test, info, durations) for test, info in tests.items()}
    users = collections.Counter(name for names in needed.values() for name in names)
    amortized = {test: own.get(test, 0.0) + sum(shared.get(name, 0.0) / users[name] for name in needed[test])
                 for test in tests}

    def cost(ids):  # the early lane runs beside the main one: the longer of the two
        runs = {name for test in ids for name in needed[test]}
        early = sum(shared.get(name, 0.0) for name in runs if name.startswith("early:"))
        main = sum(own.get(test, 0.0) for test in ids) + sum(shared.get(name, 0.0) for name in runs
                                                             if not name.startswith("early:"))
        return durations["overhead_seconds"] + max(main, early)

    must = {test for test, info in tests.items() if required(info) or test not in own}
    best = (must, 0.0, cost(must))
    for threshold in sorted(set(amortized.values())):
        ids = must | {test for test, value in amortized.items() if value <= threshold}
        total = cost(ids)
        if total > BUDGET:
            break
        best = (ids, threshold, total)
    return best


def main(write: bool) -> int:
    durations = json.loads(DURATIONS.read_text())
    tests = collected()
    fast, threshold, total = readme_tier(tests, durations)
    slow_now, slow_then = slow_ids(), set(tests) - fast
    print(f"the README's tier: {len(fast)} tests, {total:.0f} s of at most {BUDGET} (each test at most "
          f"{threshold:.1f} s, or required); the slow tier: {len(slow_then)} tests (durations: "
          f"{durations['machine']}, commit {durations['commit']})")
    for test in (test for test in tests if test not in durations["tests"]):
        print(f"no recorded duration, so in the README's tier: {test}")
    for test in sorted(slow_now & set(tests) - slow_then):
        print(f"belongs in the README's tier: {test}")
    for test in sorted(slow_then - slow_now):
        print(f"belongs in the slow tier: {test}")
    for test in sorted(slow_now - set(tests)):
        print(f"names no test of the suite: {test}")
    if write:
        SLOW_LIST.write_text(f"# The slow tier, written by `python tests/tiers.py --write` from {DURATIONS.name}.\n"
                             + "".join(f"{test}\n" for test in sorted(slow_then)))
        return 0
    return int(slow_now != slow_then)


if __name__ == "__main__":
    sys.exit(main("--write" in sys.argv[1:]))
