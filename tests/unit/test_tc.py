"""tc command builders: the argv for each kind of impairment, without touching the system."""

import pytest

from topology.profiles import GilbertElliott, LinkParams, load_profile
from topology.tc import netem_cmd


def test_cross_country_command():
    p = LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5, delay_distribution="normal", loss_pct=0.1, limit_pkts=2000)
    assert netem_cmd("gwa-eth1", p) == [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "gwa-eth1",
        "root",
        "netem",
        "limit",
        "2000",
        "delay",
        "30000us",
        "5000us",
        "distribution",
        "normal",
        "loss",
        "random",
        "0.1%",
        "rate",
        "200000000bit",
    ]


def test_uniform_jitter_has_no_distribution_and_keeps_correlation():
    args = netem_cmd("x", LinkParams(delay_ms=10, jitter_ms=2, delay_correlation_pct=25), "change")
    assert args[2] == "change"
    assert args[args.index("delay") :] == ["delay", "10000us", "2000us", "25%"]


def test_gilbert_elliott_duplicate_corrupt_reorder():
    p = LinkParams(
        delay_ms=10,
        loss_ge=GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=50, good_loss_pct=0),
        duplicate_pct=0.1,
        corrupt_pct=0.05,
        reorder_pct=0.5,
        reorder_gap=5,
    )
    args = netem_cmd("x", p)
    tail = args[args.index("loss") :]
    assert tail == [
        "loss",
        "gemodel",
        "1%",
        "25%",
        "50%",
        "0%",
        "duplicate",
        "0.1%",
        "corrupt",
        "0.05%",
        "reorder",
        "0.5%",
        "gap",
        "5",
    ]


def test_no_delay_no_delay_args():
    assert "delay" not in netem_cmd("x", LinkParams(rate_mbit=10))


# The argv of every shipped profile as tc.py built it before the netem renderer moved to topology.netem_grammar
# (and wan-flaky's schedule steps, applied to a_to_b): sharing the renderer must not change one byte of them.
SHIPPED_ARGV = {
    ("lan", "a_to_b"): "limit 1000 delay 20us rate 10000000000bit",
    ("lan", "b_to_a"): "limit 1000 delay 20us rate 10000000000bit",
    (
        "wan-congested",
        "a_to_b",
    ): "limit 320 delay 60000us 2000us distribution normal loss random 0.05% rate 20000000bit",
    (
        "wan-congested",
        "b_to_a",
    ): "limit 800 delay 60000us 2000us distribution normal loss random 0.05% rate 50000000bit",
    ("wan-cross-country", "a_to_b"): "limit 3303 delay 30000us 5000us distribution normal loss random 0.1% "
    "rate 200000000bit",
    ("wan-cross-country", "b_to_a"): "limit 3303 delay 30000us 5000us distribution normal loss random 0.1% "
    "rate 200000000bit",
    ("wan-flaky", "a_to_b"): "limit 2560 delay 25000us 3000us distribution normal loss random 0.1% rate 200000000bit",
    ("wan-flaky", "b_to_a"): "limit 2560 delay 25000us 3000us distribution normal loss random 0.1% rate 200000000bit",
    ("wan-lossy", "a_to_b"): "limit 2312 delay 40000us 8000us distribution paretonormal loss gemodel 1% 25% 50% 0% "
    "duplicate 0.1% corrupt 0.05% reorder 0.5% gap 5 rate 100000000bit",
    ("wan-lossy", "b_to_a"): "limit 2312 delay 40000us 8000us distribution paretonormal loss gemodel 1% 25% 50% 0% "
    "duplicate 0.1% corrupt 0.05% reorder 0.5% gap 5 rate 100000000bit",
    ("wan-regional", "a_to_b"): "limit 1000 delay 5000us 500us distribution normal loss random 0.01% rate 400000000bit",
    ("wan-regional", "b_to_a"): "limit 1000 delay 5000us 500us distribution normal loss random 0.01% rate 400000000bit",
}
FLAKY_STEPS_ARGV = [
    "limit 2560 delay 25000us 3000us distribution normal loss random 5% rate 200000000bit",
    "limit 7101 delay 80000us 3000us distribution normal loss random 0.1% rate 200000000bit",
    "limit 2560 delay 25000us 3000us distribution normal loss random 20% rate 200000000bit",
]


@pytest.mark.parametrize("name, direction", sorted(SHIPPED_ARGV))
def test_shipped_profiles_argv_unchanged_and_equal_to_the_printed_line(name, direction):
    p = load_profile(name).direction(direction)
    expected = ["tc", "qdisc", "replace", "dev", "dev0", "root", "netem", *SHIPPED_ARGV[name, direction].split()]
    assert netem_cmd("dev0", p) == expected
    assert netem_cmd("dev0", p)[7:] == p.netem_line().split()  # check-profile prints what tc applies


def test_schedule_steps_argv_unchanged():
    profile = load_profile("wan-flaky")
    for step, line in zip(profile.schedule, FLAKY_STEPS_ARGV, strict=True):
        p = profile.a_to_b.replace(**step.changes)
        assert netem_cmd("dev0", p, "change") == [
            "tc",
            "qdisc",
            "change",
            "dev",
            "dev0",
            "root",
            "netem",
            *line.split(),
        ]
