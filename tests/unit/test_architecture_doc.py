"""docs/architecture.md lists every module with its docstring's first line (scripts/architecture.py keeps it)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_modules_section_is_what_the_code_says():
    out = subprocess.run(
        [sys.executable, "scripts/architecture.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout


def test_the_check_finds_a_stale_section(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    import architecture

    stale = architecture.DOC.read_text().replace("- `runner.py` —", "- `runner_old.py` —")
    assert architecture.render(stale) != stale and architecture.render(
        architecture.render(stale)
    ) == architecture.render(stale)
