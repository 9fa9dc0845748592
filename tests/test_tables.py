"""Every published table in the documents is rendered from its results.json (benchmarks/tables.py): a table typed
or edited by hand, or left behind when a results.json changed, fails here."""
import gzip
import json

import pytest

from checks import load_script
from conftest import ROOT

tables = load_script("benchmarks/tables.py")
DOCUMENTS = tables.documents()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_generated_table_is_its_results_json_as_rendered_now(document):
    text = document.read_text()
    assert tables.rewritten(text) == text, f"run python benchmarks/tables.py: {document.relative_to(ROOT)} differs"


def test_the_documents_show_the_tables_an_attendee_compares_with():
    shown = {name for document in DOCUMENTS for _, name, _, _ in tables.REGION.findall(document.read_text())}
    assert {"steps", "startup", "memory", "inference", "recipe"} <= shown


def test_a_table_edited_by_hand_is_told_apart():
    rendered = f"<!-- table: steps -->\n{tables.render('steps')}<!-- /table -->\n"
    assert tables.rewritten(rendered) == rendered
    edited = rendered.replace("%", " %", 1)
    assert tables.rewritten(edited) != edited


def test_a_table_not_published_yet_says_so_and_how_to_make_it(monkeypatch):
    missing = tables.PUBLISHED / "not-run-yet" / "results.json"
    monkeypatch.setitem(tables.TABLES, "steps", (missing, tables.TABLES["steps"][1]))
    assert tables.render("steps").startswith("Not measured on today's code yet: `benchmarks/published/not-run-yet/")


def test_the_path_tables_minutes_are_one_epoch_whatever_the_epochs_the_benchmark_ran():
    """A run of 2 epochs, each 60 s of training (at 200 images/s, 12,000 images) and 30 s of evaluation after a 10 s
    start, costs in README.md's path table what its 1-epoch run does: the start, one epoch, one evaluation, and
    the rest of the full epoch at the steady images/s."""
    def run(epochs):
        history = [dict(epoch_time_s=60.0, images_per_s=200.0)] * epochs
        summary = dict(epochs=epochs, history=history, data="cifar10", global_batch_size=120)
        return tables.Run("ray_ddp", "steps", "ray_ddp", 2, status="ok", summary=summary,
                          launch_to_first_step_s=10.0, wall_s=10.0 + epochs * 90.0)
    full_epoch = tables.TRAIN_SIZES["cifar10"] // 120 * 120 / 200.0
    assert tables.evaluation_seconds(vars(run(2))) == 30.0
    assert tables.epoch_minutes(run(2), cut_to_steps=100) == tables.epoch_minutes(run(1), cut_to_steps=100) == (
        f"{-int(-(10 + 60 + 30 + full_epoch - 100 * 120 / 200.0) // 60)} min")


# The results.md that tables.py renders beside a published results.json (no document quotes them whole)
RESULTS_MD = {"cpu_share_markdown": sorted(tables.PUBLISHED.glob("cpu-share*/**/ray_ddp*/results.json"))
              + sorted(tables.PUBLISHED.glob("cpu-share*/**/torchrun_ddp*/results.json")),
              "profile_results_markdown": [tables.PUBLISHED / "profile" / "results.json"],
              "steps_results_markdown": [tables.STEPS, tables.RECIPE]}


@pytest.mark.parametrize("markdown, results", [(name, path) for name, paths in RESULTS_MD.items() for path in paths],
                         ids=lambda p: str(p.relative_to(tables.PUBLISHED)) if hasattr(p, "relative_to") else p)
def test_a_published_results_md_is_its_results_json_rendered_now(markdown, results):
    """ray_overhead.py's were written by cpu_share.py before, and profile_steps.py's by itself before tables.py drew
    it; the renderer still reads them, and draws compare_steps.py's as it did."""
    rendered = getattr(tables, markdown)(json.loads(results.read_text()))
    assert rendered == (results.parent / "results.md").read_text()


def test_the_profile_timeline_and_table_are_drawn_from_the_traces(tmp_path):
    """profile_steps.py's report from a hand-made trace of one DDP step on two ranks (the published traces are not
    committed): the timeline, and a row per rank beside a failed variant's error."""
    def event(name, start_ms, end_ms, thread=1):
        return dict(ph="X", name=name, ts=start_ms * 1000, dur=(end_ms - start_ms) * 1000, tid=thread, pid=1)

    trace = [event("ProfilerStep#2", 0, 100), event("DistributedDataParallel.forward", 10, 40),
             event("aten::linear", 11, 39), event("autograd::engine::evaluate_function: MmBackward0", 45, 60),
             event("aten::mm", 46, 59), event("c10d::allreduce_", 50, 51), event("gloo:all_reduce", 51, 75, thread=2),
             event("Optimizer.step#AdamW.step", 88, 98)]
    (tmp_path / "profile").mkdir()
    for rank in (0, 1):
        with gzip.open(tmp_path / "profile" / f"rank{rank}.json.gz", "wt") as f:
            json.dump({"traceEvents": trace}, f)
    ranks = load_script("benchmarks/trace_analysis.py").summarize(tmp_path)["ranks"]
    variants = [dict(name="ddp", title="DDP (step 02)", status="ok", error=None, load_average=0.5, ranks=ranks),
                dict(name="fsdp1", title="FSDP1 (step 03)", status="failed", error="FAILED (boom)", load_average=0.5,
                     ranks=[])]
    results = dict(date="2026-11-26", machine="a machine", command="profile_steps.py", commit="aaaaaaa",
                   warmup_steps=2, profile_steps=1, variants=variants)
    timeline = tables.write_profile_report(results, tmp_path)
    assert timeline == tmp_path / "timeline.png" and timeline.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    table = (tmp_path / "results.md").read_text()
    # forward from DDP's forward to backward, backward until the optimizer; overlapped: aten::mm while gloo ran
    for rank in (0, 1):
        assert (f"| DDP (step 02) | {rank} | 100 | 35 | 43 | 10 | 12 | all_reduce: 1 calls, 24.0 ms | "
                f"8.0 of 24.0 ms (33%) |") in table
    assert "| FSDP1 (step 03) | | FAILED (boom) | | | | | | |" in table


def test_a_step_added_to_the_registry_reaches_the_benchmark_the_tables_and_the_diff_tests(monkeypatch):
    """benchmarks/steps.py is the one list of the steps: one entry, and compare_steps.py runs it, the comparison
    table and slide show its column, the diffs slide its lesson and size, and tests/test_diffs.py bounds its diff
    (its DESIGNED_PAIRS are the registry's). The fake step reuses a real script: its folder is not the point."""
    from benchmarks import compare_steps, steps
    from benchmarks import tables as rendered  # the package's, which reads the registry the test changes

    fake = steps.Step("fake", "02-ray-train-ddp/train_ray_ddp_with_ray_data.py", "Fake TP (07)",
                      grows_from="04-ray-train-fsdp2/train_ray_fsdp2.py", lesson="04 FSDP2 → 07 fake", diff_bound=400,
                      diff_shows=("+        datasets={\"train\": train_dataset(data, args.seed)},",),
                      by_hand="a plan per layer", faults="as 04")
    monkeypatch.setattr(steps, "STEPS", [*steps.STEPS, fake])
    monkeypatch.setattr("sys.argv", ["compare_steps.py", "--data", "synthetic"])
    run = compare_steps.Run("fake", "steps", "fake", 2)
    assert str(ROOT / fake.script) in compare_steps.command(run, compare_steps.parse_args(), None)
    published = json.loads(rendered.STEPS.read_text())
    assert rendered.comparison_table(published)[0].endswith("| Fake TP (07) |")
    assert "| a plan per layer |" in "\n".join(rendered.comparison_table(published))
    assert rendered.comparison_slide(published)[0].endswith("| Fake TP |")
    [lesson] = [line for line in rendered.diffs_slide(published) if "fake" in line]
    assert lesson.startswith("| 04 FSDP2 → 07 fake | ") and lesson.split("|")[2].strip().isdigit()
    diffs = load_script("tests/test_diffs.py")
    assert (fake.grows_from, fake.script, 400, list(fake.diff_shows)) in steps.designed_pairs()
    diffs.test_designed_pair_shows_its_lesson_and_stays_small(*steps.designed_pairs()[-1])
