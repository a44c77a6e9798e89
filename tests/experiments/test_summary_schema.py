"""summary.json's one typed layout (experiments.analysis.summary): written by the analysis, read back whole,
an older or broken file named with the version it needs; a per-variant figure with a Column is a column of
summary.md's table with nothing else to change."""

import json

import pytest

from experiments.analysis import analyze, summary
from fake_run import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("summary"))
    analyze.analyze(run)
    return run


def test_the_analysis_writes_a_summary_that_reads_back_whole(run):
    s = summary.read(run)
    assert s.schema_version == summary.SCHEMA_VERSION
    assert s.variants["pdd"].completed == 9 and s.variants["pdd"].ttft_ms.n == 9
    assert json.loads((run / "summary.json").read_text()) == s.model_dump(mode="json")


def test_an_older_summary_says_which_version_it_has_and_how_to_rewrite_it(tmp_path, run):
    old = json.loads((run / "summary.json").read_text())
    del old["schema_version"]
    (tmp_path / "summary.json").write_text(json.dumps(old))
    with pytest.raises(summary.SummaryError, match=r"schema version 1; this code reads version 2.*pddlab analyze"):
        summary.read(tmp_path)


def test_a_summary_missing_a_field_names_it(tmp_path, run):
    broken = json.loads((run / "summary.json").read_text())
    del broken["variants"]["pdd"]["ttft_ms"]
    (tmp_path / "summary.json").write_text(json.dumps(broken))
    with pytest.raises(summary.SummaryError, match=r"variants\.pdd\.ttft_ms"):
        summary.read(tmp_path)


def test_a_column_field_is_a_column_of_the_per_variant_table(run):
    assert ("emulator_p99_late_ms", summary.Column("emulator p99 late ms", 1)) in summary.columns()
    header = next(line for line in (run / "summary.md").read_text().splitlines() if line.startswith("| variant | done"))
    assert header.rstrip().endswith("| emulator p99 late ms |")
