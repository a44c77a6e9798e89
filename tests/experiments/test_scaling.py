"""compute.kv_scale s: the line a run applies is the published one's rates / s (delay, jitter and loss kept), the
KV a token carries on the wire / s; bad scales are refused at spec load naming compute.kv_scale and the
direction."""

import pytest

from experiments.spec.deployment import deployment_dict
from experiments.spec.experiment import SpecError, load
from experiments.spec.scaling import ScalingError, scaled_profile, spec_scaling_record
from topology.profiles import profile_from_dict
from workers.roles.config import kv_bytes_per_token, parse_config

PUBLISHED = profile_from_dict(
    {
        "name": "published",
        "link": {"rate_mbit": 10000, "delay_ms": 15, "jitter_ms": 2, "loss_pct": 0.01},
        "b_to_a": {"rate_mbit": 400},
        "schedule": [
            {"at_s": 5, "set": {"rate_mbit": 300, "loss_pct": 1}, "direction": "a_to_b"},
            {"at_s": 9, "set": {"delay_ms": 40}},
        ],
    },
    "test",
)
MODELLED = (
    "deployment={compute: {mode: modelled, arch: kimi-k2, kv_scale: %s}, p: {accelerator: h800, devices: 16}, "
    "rld: {accelerator: h800, devices: 16}, md: {accelerator: h20, devices: 16}}"
)


def test_every_rate_is_divided_and_nothing_else():
    applied = scaled_profile(PUBLISHED, 50)
    assert (applied.a_to_b.rate_mbit, applied.b_to_a.rate_mbit) == (200.0, 8.0)
    assert applied.schedule[0].changes == {"rate_mbit": 6.0, "loss_pct": 1}
    assert applied.schedule[1] == PUBLISHED.schedule[1]
    for d in ("a_to_b", "b_to_a"):
        pub, app = PUBLISHED.direction(d), applied.direction(d)
        assert (app.delay_ms, app.jitter_ms, app.loss_pct) == (pub.delay_ms, pub.jitter_ms, pub.loss_pct)
    assert scaled_profile(PUBLISHED, 1) is PUBLISHED


@pytest.mark.parametrize(
    "s, needle",
    [
        (500, "b_to_a (400 Mbit/s) would run at 0.8 Mbit/s"),
        (350, "schedule[0] (a_to_b, 300 Mbit/s) would run at 0.857"),
    ],
)
def test_a_line_below_one_mbit_is_refused_naming_the_direction(s, needle):
    with pytest.raises(ScalingError, match=r"compute\.kv_scale=") as err:
        scaled_profile(PUBLISHED, s)
    assert needle in str(err.value)


def test_an_unlimited_line_has_nothing_to_scale():
    unlimited = profile_from_dict({"name": "open", "link": {"delay_ms": 5}}, "test")
    with pytest.raises(ScalingError, match=r"compute\.kv_scale=4: profile open's a_to_b has no rate"):
        scaled_profile(unlimited, 4)
    assert scaled_profile(unlimited, 1) is unlimited


def test_a_spec_with_kv_scale_applies_the_scaled_line_and_the_scaled_kv():
    loaded = load("pdd-smoke", [MODELLED % 4])  # wan-cross-country: 200 Mbit/s
    assert loaded.profile.a_to_b.rate_mbit == 50.0 and loaded.profile.a_to_b.delay_ms == 30.0
    data = deployment_dict(loaded.spec, "/tmp/ev")
    assert data["policy"]["wan_rate_mbit"] == 50.0  # the route decision sees the scaled line ...
    assert kv_bytes_per_token(parse_config(data)) == 70_272 // 4  # ... and the scaled bytes
    record = spec_scaling_record(loaded.spec)
    assert record["kv_scale"] == 4.0
    assert record["published_rate_mbit"]["a_to_b"] == 200.0 and record["applied_rate_mbit"]["a_to_b"] == 50.0
    assert spec_scaling_record(load("pdd-smoke").spec) is None


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ([MODELLED % 400], "compute.kv_scale=400: profile wan-cross-country's a_to_b (200 Mbit/s) would run at 0.5"),
        ([MODELLED % 0.5], "deployment.compute.kv_scale=0.5: expected a number >= 1"),
        ([MODELLED % 4, "profile=UNLIMITED"], "profile open's a_to_b has no rate (unlimited): nothing to scale"),
        (
            [MODELLED % 4, "variant_defs={pdd-s8: {mode: pdd, deployment: {compute: {kv_scale: 8}}}}"],
            "variant_defs.pdd-s8.deployment.compute.kv_scale=8: the variants share one line",
        ),
        (["deployment={compute: {kv_scale: 4}}"], "compute.kv_scale apply to compute.mode modelled only"),
    ],
)
def test_a_bad_kv_scale_is_refused_at_spec_load(overrides, needle, tmp_path):
    (tmp_path / "open.yaml").write_text("name: open\nlink: {delay_ms: 5}\n")
    overrides = [o.replace("UNLIMITED", str(tmp_path / "open.yaml")) for o in overrides]
    with pytest.raises(SpecError) as err:
        load("pdd-smoke", overrides)
    assert needle in str(err.value)


def test_metadata_json_records_s_and_the_published_and_applied_rates(tmp_path):
    from experiments.rundir import metadata
    from experiments.run.runner import new_metadata

    metadata.write(tmp_path, new_metadata(load("pdd-smoke", [MODELLED % 8]).spec, "scaled"))
    scaling = metadata.read(tmp_path).line_scaling
    assert scaling.kv_scale == 8.0
    assert scaling.published_rate_mbit == {"a_to_b": 200.0, "b_to_a": 200.0}
    assert scaling.applied_rate_mbit == {"a_to_b": 25.0, "b_to_a": 25.0}
    metadata.write(tmp_path, new_metadata(load("pdd-smoke").spec, "published"))
    assert metadata.read(tmp_path).line_scaling is None
