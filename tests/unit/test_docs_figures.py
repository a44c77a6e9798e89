"""docs/' tables of figures are what their kept runs say (scripts/docs_figures.py, make docs-figures)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_figures  # noqa: E402


def test_every_block_with_kept_data_is_up_to_date():
    out = subprocess.run(
        [sys.executable, "scripts/docs_figures.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout


def test_a_block_is_rewritten_from_its_kept_data_and_one_without_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(docs_figures, "render", lambda name: "| fresh |\n" if name == "kept" else None)
    text = (
        "<!-- figures: kept | command: make x -->\n| old |\n<!-- /figures -->\n"
        "<!-- figures: lost | command: make y -->\n| old |\n<!-- /figures -->\n"
    )
    new, missing = docs_figures.rewrite(text)
    assert "| fresh |" in new and new.count("| old |") == 1 and missing == ["lost"]
