"""Regenerate the tables of figures in docs/ from the runs kept under docs/runs/ (make docs-figures).

    .venv/bin/python scripts/docs_figures.py            # rewrite every block that has kept data
    .venv/bin/python scripts/docs_figures.py --check    # exit 1 where a block differs from its kept data
    .venv/bin/python scripts/docs_figures.py --keep NAME RUN_OR_SWEEP_DIR   # keep a run's (or sweep's) files

A block in a docs page is

    <!-- figures: NAME | command: the command that made it -->
    ...the table...
    <!-- /figures -->

and its data lie in docs/runs/NAME/: a run's summary.json and metadata.json (the per-variant table, the
intervals, the comparisons: experiments.analysis.summary_md.figures), a sweep's sweep.json (its ratios over
repeats and the tally of within-run verdicts), or profiles/<profile>/summary.json for each profile of a
profile matrix (the table ../shared/tools/profile-matrix prints). A block without kept data is listed and
left as it is: its figures are from an earlier run that docs/ does not keep.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.analysis import summary as summary_mod, summary_md, sweep_report  # noqa: E402

DOCS, RUNS = ROOT / "docs", ROOT / "docs" / "runs"
BLOCK = re.compile(
    r"(<!-- figures: (?P<name>[\w.-]+) \| command: (?P<cmd>.*?) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S
)
KEPT = ("summary.json", "metadata.json", "sweep.json")


def render(name: str) -> str | None:
    """The block's body from docs/runs/name/ (its headings demoted under the page's own), None without kept
    data."""
    body = _render(name)
    return None if body is None else re.sub(r"^## ", "#### ", body, flags=re.M)


def _render(name: str) -> str | None:
    src = RUNS / name
    if (src / "summary.json").exists():
        return "\n".join(summary_md.figures(summary_mod.read(src))) + "\n"
    if (src / "sweep.json").exists():
        agg = json.loads((src / "sweep.json").read_text()).get("aggregate") or []
        return "\n".join(sweep_report._comparison_tables(agg) + sweep_report._verdicts_section(agg)) + "\n"
    if (src / "profiles").is_dir():
        return profile_matrix(sorted((src / "profiles").iterdir()))
    return None


def profile_matrix(dirs: list[Path]) -> str:
    """The table of ../shared/tools/profile-matrix, one row per profile and variant."""
    lines = [
        "| profile | variant | done | TTFT p50 ms | MD share | handoffs | fallbacks | emulator p99 late ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in dirs:
        s = summary_mod.read(d)
        for v, x in s.variants.items():
            late = "–" if x.emulator_p99_late_ms is None else f"{x.emulator_p99_late_ms:.1f}"
            fb = ", ".join(f"{k} {n}" for k, n in x.fallbacks.items())
            md = "–" if x.md_token_share is None else f"{x.md_token_share:.0%}"
            p50 = "failed" if "p50" in x.ttft_ms.beyond_completed else summary_md._f(x.ttft_ms.p50)
            lines.append(
                f"| {d.name} | {v} | {x.completed}/{x.requests} | {p50} | {md} | {x.handoff.get('count', 0)} | "
                f"{fb} | {late} |"
            )
    return "\n".join(lines) + "\n"


def rewrite(text: str) -> tuple[str, list[str]]:
    """text with every block that has kept data rewritten; the names of the blocks without."""
    missing = []

    def one(m: re.Match) -> str:
        body = render(m["name"])
        if body is None:
            missing.append(m["name"])
            return m[0]
        return f"{m[1]}{body}{m[5]}"

    return BLOCK.sub(one, text), missing


def keep(name: str, src: Path) -> None:
    """Copy a run's (or sweep's) kept files into docs/runs/name/ (a profile matrix: each profile's run under
    profiles/<profile>/, given as NAME/PROFILE)."""
    dst = RUNS / name
    dst.mkdir(parents=True, exist_ok=True)
    for f in KEPT:
        if (src / f).exists():
            shutil.copy2(src / f, dst / f)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--keep"]:
        keep(argv[1], Path(argv[2]))
        return 0
    check, stale, missing = "--check" in argv, [], []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        new, lost = rewrite(text)
        missing += [f"{page.relative_to(ROOT)}: {n}" for n in lost]
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not check:
                page.write_text(new)
    for m in missing:
        print(f"no kept data (figures from an earlier run): {m}")
    if check and stale:
        print("out of date with their kept data: " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
