"""Variants of one mode side by side (variant_defs) and the issue deadline: refused at the edge when wrong,
and what the runner derives from them."""

import pytest

from experiments.spec.deployment import deployment_dict
from experiments.spec.experiment import SpecError, load_spec, variant_mode, variant_overrides
from workers.roles.config import parse_config


def test_a_defined_variant_runs_its_mode_with_its_own_overrides():
    s = load_spec("pdd-congestion")
    assert variant_mode(s, "pdd-measured") == "pdd" and variant_mode(s, "pd-cross") == "pd-cross"
    cfg = parse_config(
        deployment_dict(s, "/tmp/ev", variant_mode(s, "pdd-measured"), variant_overrides(s, "pdd-measured"))
    )
    assert cfg.policy.mode == "pdd" and cfg.policy.wan_estimate == "measured"
    plain = parse_config(deployment_dict(s, "/tmp/ev", "pdd", variant_overrides(s, "pdd")))
    assert plain.policy.wan_estimate == "static" and plain.policy.direct_max_transfer_ms == 40


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["variants=[pdd, pdd-x]"], "variants=['pdd', 'pdd-x']: each once, from"),
        (["variant_defs={pdd: {mode: pdd}}"], "variant_defs.pdd: a defined variant needs a name of its own"),
        (["variant_defs={x: {mode: fast}}"], "variant_defs.x.mode='fast'; allowed:"),
        (["variant_defs={x: {mode: pdd, colour: red}}"], "variant_defs.x: expected {mode, deployment}"),
        (
            ["variant_defs={x: {mode: pdd, deployment: {policy: {wan_estimate: guess}}}}"],
            "variant_defs.x.deployment: policy.wan_estimate='guess'; allowed: ['static', 'measured']",
        ),
        (["timeouts.issue_s=-1"], "timeouts.issue_s=-1"),
        # a defined variant's name is its folder variants/<name>/: one plain path component, as the spec's name
        (["variant_defs={'../../..': {mode: pdd}}", "variants=[pdd, '../../..']"], "variant_defs: key '../../..'"),
        (["variant_defs={'a/b': {mode: pdd}}"], "variant_defs: key 'a/b': letters, digits"),
        (["variant_defs={'.hidden': {mode: pdd}}"], "variant_defs: key '.hidden'"),
        (["variant_defs={'': {mode: pdd}}"], "variant_defs: key ''"),
        (["variant_defs={7: {mode: pdd}}"], "variant_defs: key 7"),
    ],
)
def test_bad_variants_are_refused_before_any_topology(overrides, needle):
    with pytest.raises(SpecError) as err:
        load_spec("pdd-vs-baselines", overrides)
    assert needle in str(err.value), str(err.value)


def test_the_default_experiment_bounds_its_window():
    t = load_spec("pdd-vs-baselines").timeouts
    assert t.issue_s == 240 and t.issue_s + t.request_s <= t.variant_s


def test_a_variant_may_run_fewer_workers_than_the_spec_has():
    from experiments.spec.deployment import deployment_dict
    from experiments.spec.experiment import variant_pools
    from workers.roles.config import parse_config

    s = load_spec(
        "pdd-smoke",
        [
            "pools.rld.workers=2",
            "variant_defs={pdd-same: {mode: pdd, pools: {rld: 1}}}",
            "variants=[pd-intra, pdd-same]",
        ],
    )
    assert variant_pools(s, "pd-intra") == {"p": 1, "rld": 2, "md": 1}
    assert variant_pools(s, "pdd-same") == {"p": 1, "rld": 1, "md": 1}
    cfg = parse_config(deployment_dict(s, "/tmp/e", "pdd", pools=variant_pools(s, "pdd-same")))
    assert [w.name for w in cfg.rld] == ["rld1"]
    with pytest.raises(SpecError, match=r"variant_defs.x.pools.rld=3 out of range \[1, 2\] \(pools.rld.workers\)"):
        load_spec("pdd-smoke", ["pools.rld.workers=2", "variant_defs={x: {mode: pdd, pools: {rld: 3}}}"])


def test_a_pools_cores_are_checked_and_reach_the_process_runtime():
    from types import SimpleNamespace

    from experiments.run import deploy
    from experiments.spec.deployment import pool_cpusets
    from topology.runtime import ProcessRuntime

    s = load_spec("pdd-smoke", ["pools.md.cpuset=1", "pools.p.cpuset='0'"])
    assert pool_cpusets(s) == {"p": "0", "md": "1"}
    with pytest.raises(SpecError, match=r"pools.rld.cpuset='99': this machine has cores 0-"):
        load_spec("pdd-smoke", ["pools.rld.cpuset=99"])
    started = {}

    class Testbed:
        config = SimpleNamespace(runtime=ProcessRuntime())

        def popen(self, host, argv, **kw):
            started[host] = argv
            return SimpleNamespace(poll=lambda: None)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        deploy.Runtime(Testbed(), Path(d) / "c.yaml", Path(d), {"md": 1}, pool_cpusets(s)).start()
    assert started["md1"][:3] == ["taskset", "-c", "1"] and started["p1"][:3] == ["taskset", "-c", "0"]
    assert started["rld1"][0] != "taskset" and started["router"][0] != "taskset"


def test_sweep_points_name_one_folder_each_whatever_the_swept_values():
    """Swept values become point and profile file names: hostile ones stay one component below runs/."""
    from experiments.run import sweep

    values = ("../../..", "/etc/passwd", "a/../../b", "..")
    plan = sweep.Plan("pdd-smoke", (), None, None, (sweep.Axis("description", values),), 1)
    for p in sweep.grid(plan):
        assert "/" not in p.name and p.name not in (".", "..") and p.name.startswith(f"p{p.index:02d}-r0"), p.name
