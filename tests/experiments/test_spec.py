"""Experiment specs: validated at the edge, overrides checked against the schema, errors name the field."""

import pytest

from experiments.spec import experiment as spec
from experiments.spec.experiment import SpecError, load, load_spec, variant_mode


def test_shipped_specs_load():
    for name in spec.available_specs():
        s = load_spec(name)
        assert s.name and s.variants


def test_default_spec_compares_the_four_variants_on_cross_country():
    s = load_spec("pdd-vs-baselines")
    assert s.variants == ("colocated", "pd-intra", "pd-cross", "pdd")
    assert s.profile == "wan-cross-country" and s.runtime == "docker"


def test_overrides_are_yaml_typed():
    s = load_spec(
        "pdd-vs-baselines",
        [
            "workload.synthetic.sessions=2",
            "workload.synthetic.turns=[2, 3]",
            "slo.ttft_ms=500",
            "variants=[pd-cross, pdd]",
        ],
    )
    assert s.workload.synthetic.sessions == 2 and s.workload.synthetic.turns == (2, 3)
    assert s.slo.ttft_ms == 500.0 and s.variants == ("pd-cross", "pdd")


def test_top_level_arguments_override_the_spec():
    s = load_spec("pdd-vs-baselines", profile="wan-lossy", backend="userspace")
    assert s.profile == "wan-lossy" and s.backend == "userspace"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("workload.synthetic.sessionz=3", "workload.synthetic has no field 'sessionz'; allowed: ['sessions'"),
        ("nope=1", "spec has no field 'nope'; allowed: ['name'"),
        ("workload.synthetic.sessions=many", "workload.synthetic.sessions: expected int, got 'many'"),
        ("workload.synthetic.turns=[3]", "workload.synthetic.turns: expected 2 values"),
        ("variants=[pdd, warp]", "each once, from ['colocated', 'pd-intra', 'pd-cross', 'pdd']"),
        ("handoff=teleport", "handoff='teleport'; allowed: ['oneshot', 'chunked', 'auto', 'kv']"),
        ("runtime=vm", "runtime='vm'; allowed: ['process', 'docker', 'ray']"),
        ("model=huge", "model='huge'; allowed: ['default', 'default-bf16', 'default-fp16', 'small'"),
        ("workload.synthetic.singular_fraction=0.9", "singular_fraction=0.9 out of range [0, 0.5]"),
        ("deployment.policy.modez=pdd", "deployment: policy: unknown key(s) ['modez']"),
        ("deployment.policy.chunk_tokens=0", "policy.chunk_tokens=0 out of range"),
        ("profile=no-such", "unknown profile 'no-such'; available:"),
        ("workload.source=trace", "workload.trace: required"),
        ("sessions", "expected dotted.key=value"),
        ("name=../../../x", "name='../../../x': letters, digits"),
        ("name=a/b", "it names the run directory"),
        ("deployment.events_dir=/etc", "deployment.events_dir: set by the testbed"),
        ("deployment.md.host=10.9.9.9", "deployment.md.host: set by the topology"),
        ("deployment.p.grpc_port=1", "deployment.p.grpc_port: set by the topology"),
        ("deployment.weights_dir=/tmp/w", "deployment.weights_dir: set by the testbed"),
        ("deployment.grpc_threads=32", "grpc_threads=32 must be at least decode.max_sessions (64) + 8"),
    ],
)
def test_bad_overrides_fail_with_the_field_and_allowed_values(override, needle):
    with pytest.raises(SpecError) as err:
        load_spec("pdd-vs-baselines", [override])
    assert needle in str(err.value)


def test_unknown_spec_lists_the_registry():
    with pytest.raises(SpecError, match="unknown experiment 'nope'; available: .*pdd-vs-baselines"):
        load_spec("nope")


def test_unknown_key_in_a_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("name: x\nworkload: {synthetc: {}}\n")
    with pytest.raises(SpecError, match=r"workload: unknown key\(s\) \['synthetc'\]; allowed: \['source'"):
        load_spec(str(p))


def test_unknown_runtime_is_refused_before_anything_starts():
    with pytest.raises(SpecError, match="runtime"):
        load_spec("pdd-smoke", ["runtime=podman"])


def test_resolved_spec_round_trips():
    s = load_spec("pdd-smoke")
    assert spec.from_dict(spec.to_dict(s)) == s


def test_deployment_follows_the_profile_rate():
    from experiments.run.deploy import deployment_dict
    from workers.roles.config import parse_config

    s = load_spec("pdd-smoke", profile="wan-lossy")
    cfg = parse_config(deployment_dict(s, "/tmp/ev", mode="pd-cross"))
    assert cfg.policy.wan_rate_mbit == 100.0 and cfg.policy.mode == "pd-cross"
    assert cfg.md[0].host == "10.2.0.61" and cfg.rld[0].host == "10.1.0.41" and cfg.router.host == "10.1.0.11"


def test_a_plan_parses_the_profile_once_and_the_link_it_runs_sets_the_rate():
    import dataclasses

    from experiments.run import runner
    from experiments.spec import workload
    from experiments.run.deploy import deployment_dict
    from topology.profiles import load_profile

    s = load_spec("pdd-smoke", profile="wan-lossy")
    plan = runner.prepare(s)
    assert plan.spec is s and plan.profile == load_profile("wan-lossy")
    assert list(plan.requests) == workload.build(s)
    # A shared topology swapped to another link: the roles are told the rate of the link as it runs.
    swapped = load_profile("wan-regional")
    swapped = dataclasses.replace(swapped, a_to_b=dataclasses.replace(swapped.a_to_b, rate_mbit=37.0))
    assert deployment_dict(s, "/tmp/ev", wan=swapped)["policy"]["wan_rate_mbit"] == 37.0
    assert deployment_dict(s, "/tmp/ev")["policy"]["wan_rate_mbit"] == 100.0  # none given: spec.profile's


def test_a_run_parses_its_profile_once(monkeypatch, tmp_path):
    """From the command line's load to every variant's deployment config: one parse of the WAN profile (the
    topology then takes the Plan's Profile; the LAN's, `lan`, is parsed apart)."""
    import topology.profiles as profiles
    from experiments.run import deploy, runner

    calls, real = [], profiles.load_profile
    monkeypatch.setattr(profiles, "load_profile", lambda *a, **k: calls.append(a) or real(*a, **k))
    loaded = load("pdd-vs-baselines", ["variant_defs={pdd-measured: {mode: pdd}}", "variants=[pd-intra,pdd-measured]"])
    plan = runner.prepare(loaded.spec, loaded.profile)
    for v in plan.spec.variants:
        deploy.write_deployment(
            plan.spec, tmp_path / f"{v}.yaml", tmp_path, variant_mode(plan.spec, v), wan=plan.profile
        )
    assert len([a for a in calls if a[0] != "lan"]) == 1 and plan.profile.name == "wan-cross-country"


@pytest.mark.parametrize(
    "sets,refusal",
    [
        (["pools.rld.cpuset=99"], r"pools.rld.cpuset='99': this machine has cores 0-"),
        # 19 MD workers of about 66 GB each (the small model, 4M tokens of KV): 1.25 TB
        (["model=small", "capacity_tokens.md=4194304", "pools.md.workers=19"], "more than this machine's"),
        pytest.param(
            ["runtime=process", "pools.md.device=cuda"],
            r"pools\.md\.device=cuda: runtime process runs every worker on this machine",
            marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU"),
        ),
    ],
    ids=["cores", "memory", "gpus"],
)
def test_this_machines_checks_are_left_out_only_when_asked(sets, refusal):
    """check_machine=False: a deployment that runs nowhere (the simulator) is not judged by this machine."""
    with pytest.raises(SpecError, match=refusal):
        load("pdd-smoke", sets)
    loaded = load("pdd-smoke", sets, check_machine=False)
    with pytest.raises(SpecError, match=refusal):
        spec.validate(loaded.spec, loaded.profile)
    assert spec.validate(loaded.spec, loaded.profile, check_machine=False) is loaded.spec
