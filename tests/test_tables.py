"""Every published table in the documents is rendered from its results.json (benchmarks/tables.py): a table typed
or edited by hand, or left behind when a results.json changed, fails here."""
import json

import pytest

from conftest import ROOT, load_script

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


RAY_OVERHEAD = {"cpu_share_markdown": sorted(tables.PUBLISHED.glob("cpu-share*/**/ray_ddp*/results.json"))
                + sorted(tables.PUBLISHED.glob("cpu-share*/**/torchrun_ddp*/results.json")),
                "fit_processes_markdown": [tables.PUBLISHED / "ray-fit-processes" / "results.json"],
                "report_latency_markdown": [tables.PUBLISHED / "report-latency" / "results.json"]}


@pytest.mark.parametrize("markdown, results", [(name, path) for name, paths in RAY_OVERHEAD.items() for path in paths],
                         ids=lambda p: str(p.relative_to(tables.PUBLISHED)) if hasattr(p, "relative_to") else p)
def test_ray_overheads_published_results_md_is_its_results_json_rendered_now(markdown, results):
    """benchmarks/ray_overhead.py's three tools wrote these before they were one; the renderer still reads them."""
    rendered = getattr(tables, markdown)(json.loads(results.read_text()))
    assert rendered == (results.parent / "results.md").read_text()
