"""The Makefile as a user meets it: `make help` names every target, a spec's own profile holds unless PROFILE is
given, and the targets that need no Docker do not start it (dry runs: `make -n`, nothing executes)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*args: str) -> str:
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def phony_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())


def test_help_lists_every_target_with_one_line():
    out = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    listed = {line.split()[1] for line in out.splitlines() if line.strip().startswith("make ")}
    assert listed == phony_targets()


def test_run_experiment_passes_profile_only_when_given():
    assert "--profile" not in dry_run("run-experiment")
    assert "--profile wan-lossy" in dry_run("run-experiment", "PROFILE=wan-lossy")


def test_setup_and_the_targets_that_need_no_docker_start_no_dockerd():
    assert "docker_rt.engine" not in (ROOT / "scripts" / "setup.sh").read_text()
    for target in (["profiles"], ["analyze", "RUN=results/x"], ["setup"], ["lint"]):
        assert "docker_rt.engine" not in dry_run(*target), target
    assert "docker_rt.engine ensure" in dry_run("docker")


def test_net_passes_a_mininet_topology_class_as_mn_takes_it():
    assert "--custom" not in dry_run("net", "TOPO=three-sites")
    assert "net  --custom mine.py --topo chain,3 --backend auto" in dry_run("net", "CUSTOM=mine.py", "TOPO=chain,3")
