"""A spec's `topology` (experiments.spec.sites): a topology file's addresses reach the roles' config, the
pool counts it places are checked, and what the testbed does not run on a topology file yet is refused by
name before anything starts (including `pddlab simulate` and `pddlab serve`)."""

import subprocess
import sys

import pytest

from experiments.rundir.files import REPO
from experiments.spec import sites
from experiments.spec.deployment import deployment_dict
from experiments.spec.experiment import SpecError, load_spec


def test_the_three_sites_experiment_places_md3_md4_in_site_c():
    spec = load_spec("pdd-three-sites")
    cfg = deployment_dict(spec, "/tmp/events")
    assert [(w["name"], w["host"]) for w in cfg["md"]] == [
        ("md1", "10.2.0.61"),
        ("md2", "10.2.0.62"),
        ("md3", "10.3.0.63"),
        ("md4", "10.3.0.64"),
    ]
    assert cfg["p"][0]["host"] == "10.1.0.21" and cfg["router"]["host"] == "10.1.0.11"
    assert sites.md_lines(spec) == {"md1": "wanb", "md2": "wanb", "md3": "wanc", "md4": "wanc"}


def test_the_default_topology_keeps_namings_addresses():
    spec = load_spec("pdd-vs-baselines")
    assert sites.is_default(spec) and sites.addresses(spec) is None and sites.md_lines(spec) == {}
    assert deployment_dict(spec, "/tmp/events")["md"][0]["host"] == "10.2.0.61"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["pools.md.workers=3"],
            "topology='three-sites': pools.md=3: topology 'three-sites' places 4 md workers (b: 2, c: 2)",
        ),
        (["topology=nowhere"], "topology='nowhere': unknown topology 'nowhere'; available: three-sites, two-clusters"),
        (["runtime=ray"], "topology='three-sites': the Ray runtime runs on the default topology"),
        (
            ["cross_traffic=[{direction: a_to_b, start_s: 0, duration_s: 5, kind: tcp}]"],
            "topology='three-sites': cross traffic (its hosts xa, xb are the two-cluster network's) runs on",
        ),
    ],
)
def test_what_a_topology_file_cannot_run_with_is_refused_by_name(overrides, message):
    with pytest.raises(SpecError) as err:
        load_spec("pdd-three-sites", overrides)
    assert message in str(err.value)


@pytest.mark.parametrize("command", [["simulate", "pdd-three-sites", "--requests", "5"], ["serve", "pdd-three-sites"]])
def test_simulate_and_serve_refuse_a_topology_file(command):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.cli", *command], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "topology='three-sites':" in proc.stderr and "default topology (two-clusters) only" in proc.stderr


def test_each_md_names_its_line_and_two_lines_turns_on_the_routers_line_choice():
    spec = load_spec("pdd-two-lines")
    cfg = deployment_dict(spec, "/tmp/events")
    assert [(w["name"], w["line"]) for w in cfg["md"]] == [("md1", "fast"), ("md2", "cheap")]
    assert cfg["policy"]["lines"] == {
        "fast": {"rate_mbit": 1000.0, "delay_ms": 10.0},  # the spec's profile: the topology's first line
        "cheap": {"rate_mbit": 200.0, "delay_ms": 30.0},  # the file's own wan-cross-country
    }
    assert cfg["policy"]["pick_md"] == "line_measured"  # two-lines.yaml says choose: measured
    blind = deployment_dict(spec, "/tmp/events", overrides={"policy": {"pick_md": "cache_aware"}})
    assert blind["policy"]["pick_md"] == "cache_aware" and blind["md"][1]["line"] == "cheap"
    three = deployment_dict(load_spec("pdd-three-sites"), "/tmp/events")
    assert "pick_md" not in three["policy"] and three["md"][3]["line"] == "wanc"
    assert "line" not in deployment_dict(load_spec("pdd-vs-baselines"), "/tmp/events")["md"][0]


def test_kv_scale_is_refused_on_a_topology_file():
    with pytest.raises(
        SpecError, match=r"compute.kv_scale \(only the first line would be scaled\) runs on the default"
    ):
        load_spec("pdd-two-lines", ["deployment.compute={mode: modelled, arch: default, kv_scale: 10}"])


def test_a_network_without_roles_is_refused_by_a_run(tmp_path):
    net = tmp_path / "lan2.yaml"
    net.write_text(
        "name: lan2\nsites:\n  - {name: s1, subnet: 10.1.0.0/24, named: [h1]}\n"
        "  - {name: s2, subnet: 10.2.0.0/24, named: [h2]}\nlines:\n  - {name: s1s2, sites: [s1, s2], profile: {}}\n"
    )
    with pytest.raises(SpecError) as err:
        load_spec("pdd-three-sites", [f"topology={net}"])
    assert "places no roles (named hosts only): a network for `pddlab net` alone" in str(err.value)
