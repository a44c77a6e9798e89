"""Spec fields of the network impairment: schedule_clock, schedule, cross_traffic — refused at the edge."""

import pytest

from experiments.spec.experiment import SpecError, from_dict, load_spec, to_dict


def test_pdd_congestion_has_cross_traffic_and_an_outage_on_the_variant_clock():
    s = load_spec("pdd-congestion")
    assert s.schedule_clock == "variant" and s.variants == ("pd-intra", "pd-cross", "pdd", "pdd-measured")
    assert s.variant_defs["pdd-measured"] == {"mode": "pdd", "deployment": {"policy": {"wan_estimate": "measured"}}}
    [flow] = s.cross_traffic
    assert (flow.kind, flow.direction, flow.streams, flow.start_s, flow.end_s) == ("tcp", "a_to_b", 2, 20, 40)
    [outage] = s.schedule
    assert outage["set"] == {"loss_pct": 100} and outage["direction"] == "both" and outage["duration_s"] == 5
    assert from_dict(to_dict(s)) == s


def test_defaults_play_the_schedule_on_each_variant_clock_without_cross_traffic():
    s = load_spec("pdd-vs-baselines")
    assert s.schedule_clock == "variant" and s.schedule == () and s.cross_traffic == ()


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (
            ["timeouts.variant_s=30"],
            "profile wan-flaky's schedule: its last event at 42 s lies beyond "
            "timeouts.variant_s=30; allowed: events within [0, 30] s",
        ),
        (["schedule=[{at_s: 530, duration_s: 20, set: {loss_pct: 100}}]"], "schedule: its last event at 550 s"),
        (["schedule=[{at_s: 5, set: {loss_pcx: 1}}]"], "schedule[0].set: unknown key(s) ['loss_pcx']"),
        (["schedule=[{at_s: 5, set: {loss_pct: 101}}]"], "schedule[0].set.loss_pct=101 out of range [0, 100]"),
        (["schedule=[{at_s: 5, direction: up, set: {loss_pct: 1}}]"], "schedule[0].direction='up'; allowed: ['both'"),
        (["schedule_clock=wall"], "schedule_clock='wall'; allowed: ['link', 'variant']"),
        (["cross_traffic=[{kind: tcp}]"], "cross_traffic[0].duration_s: required"),
        (["cross_traffic=[{kind: tcp, duration_s: 5, colour: red}]"], "cross_traffic[0]: unknown key(s) ['colour']"),
        (
            ["cross_traffic=[{kind: udp, duration_s: 5, rate_mbit: 250}]"],
            "cross_traffic[0].rate_mbit=250 exceeds the link's a_to_b rate; allowed: (0, 200] Mbit/s",
        ),
        (
            ["cross_traffic=[{kind: tcp, duration_s: 20, start_s: 15}]", "timeouts.variant_s=30"],
            "start_s + duration_s = 35 s lies beyond timeouts.variant_s=30",
        ),
        (["cross_traffic=[{kind: tcp, duration_s: 5, congestion: nope}]"], "congestion='nope' is not offered"),
    ],
)
def test_bad_impairments_are_refused_before_any_topology(overrides, needle):
    with pytest.raises(SpecError) as err:
        load_spec("pdd-vs-baselines", overrides, profile="wan-flaky" if "variant_s=30" in overrides[0] else None)
    assert needle in str(err.value)


def test_the_link_clock_allows_a_schedule_longer_than_a_window():
    s = load_spec("pdd-vs-baselines", ["schedule_clock=link", "timeouts.variant_s=30"], profile="wan-flaky")
    assert s.schedule_clock == "link"
