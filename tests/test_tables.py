"""Every published table in the documents is rendered from its results.json (benchmarks/tables.py): a table typed
or edited by hand, or left behind when a results.json changed, fails here."""
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
