"""tc command builders: the argv for each kind of impairment, without touching the system."""

import pytest

from topology.netem_options import Slot
from topology.profiles import GilbertElliott, LinkParams, load_profile
from topology.tc import kept_after, kept_by, netem_cmd, stale_after_change


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
    assert args[args.index("delay") : args.index("delay") + 4] == ["delay", "10000us", "2000us", "25%"]


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
# A live change also says 0% delay correlation, reorder, corrupt and no slot (netem_change keeps what it is not told).
FLAKY_STEPS_ARGV = [
    "limit 2560 delay 25000us 3000us distribution normal loss random 5% rate 200000000bit",
    "limit 7101 delay 80000us 3000us distribution normal loss random 0.1% rate 200000000bit",
    "limit 2560 delay 25000us 3000us distribution normal loss random 20% rate 200000000bit",
]
CHANGE_ZEROS = ""  # not sent for now (topology.tc.netem_cmd)


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
            *CHANGE_ZEROS.split(),
        ]


# ---- what iproute2 and the kernel need to be told (tc/q_netem.c, sch_netem.c's netem_change) ----


def test_a_duplicate_correlation_alone_rides_on_a_zero_delay_correlation():
    # tc sends the correlations only when delay, loss, reorder or corrupt names one: the duplicate's would be lost.
    args = netem_cmd("x", LinkParams(delay_ms=2, duplicate_pct=50, duplicate_correlation_pct=90))
    assert args[6:] == ["netem", "limit", "1000", "delay", "2000us", "0us", "0%", "duplicate", "50%", "90%"]
    with_jitter = netem_cmd("x", LinkParams(delay_ms=2, jitter_ms=1, duplicate_pct=50, duplicate_correlation_pct=90))
    assert with_jitter[9:13] == ["delay", "2000us", "1000us", "0%"]
    no_delay = netem_cmd("x", LinkParams(limit_pkts=50, duplicate_pct=50, duplicate_correlation_pct=90))
    assert no_delay[6:] == ["netem", "limit", "50", "delay", "0us", "0us", "0%", "duplicate", "50%", "90%"]


@pytest.mark.parametrize(
    "fields",
    [
        {"delay_ms": 2, "jitter_ms": 1, "delay_correlation_pct": 25},
        {"loss_pct": 1, "loss_correlation_pct": 25},
        {"delay_ms": 5, "reorder_pct": 10, "reorder_correlation_pct": 25},
        {"corrupt_pct": 1, "corrupt_correlation_pct": 25},
    ],
)
def test_no_zero_is_added_where_another_correlation_carries_the_duplicates(fields):
    p = LinkParams(duplicate_pct=50, duplicate_correlation_pct=90, **fields)
    assert netem_cmd("x", p)[7:] == p.netem_line().split()


def test_an_uncorrelated_install_is_the_printed_line_word_for_word():
    p = LinkParams(delay_ms=2, duplicate_pct=50, corrupt_pct=1)
    assert netem_cmd("x", p)[7:] == p.netem_line().split()


def test_a_table_the_new_line_does_not_name_is_stale_only_where_it_would_be_used():
    pareto = LinkParams(delay_ms=30, jitter_ms=5, delay_distribution="pareto")
    assert kept_by(pareto) == {"delay table"} and kept_by(LinkParams(delay_ms=30, jitter_ms=5)) == set()
    assert stale_after_change(frozenset({"delay table"}), LinkParams(delay_ms=30, jitter_ms=5)) == ("delay table",)
    assert not stale_after_change(frozenset({"delay table"}), LinkParams(delay_ms=30))  # no jitter: unused
    assert not stale_after_change(frozenset({"delay table"}), pareto.replace(delay_distribution="normal"))  # sent
    assert not stale_after_change(frozenset(), LinkParams(delay_ms=30, jitter_ms=5))


@pytest.mark.parametrize(
    ("before", "after", "stale"),
    [
        ({"corrupt_pct": 5}, {}, ("corrupt",)),
        ({"corrupt_pct": 5}, {"corrupt_pct": 1}, ()),  # named again
        ({"rate_mbit": 100}, {}, ("rate",)),
        ({"rate_mbit": 100}, {"rate_mbit": 50}, ()),
        ({"slot": Slot(delay_ms=1, max_delay_ms=2)}, {}, ("slot",)),
        ({"loss_pct": 1, "loss_correlation_pct": 25}, {"loss_pct": 1}, ("correlations",)),
        ({"loss_pct": 1, "loss_correlation_pct": 25}, {"delay_ms": 5}, ()),  # nothing draws them
        (
            {"loss_pct": 1, "loss_correlation_pct": 25},
            {"loss_pct": 2, "corrupt_pct": 1, "corrupt_correlation_pct": 5},
            (),
        ),
        ({"reorder_pct": 10, "delay_ms": 5}, {"delay_ms": 5}, ()),  # the gap of 0 turns it off
        (
            {"corrupt_pct": 5, "rate_mbit": 100, "delay_ms": 2, "jitter_ms": 1, "delay_correlation_pct": 50},
            {"delay_ms": 30, "jitter_ms": 1},
            ("correlations", "corrupt", "rate"),
        ),
    ],
)
def test_what_a_change_would_keep_in_use_is_stale(before, after, stale):
    assert stale_after_change(kept_by(LinkParams(**before)), LinkParams(**after)) == stale


def test_correlations_sent_as_zeros_are_not_kept_after_a_change():
    correlated = kept_by(LinkParams(loss_pct=1, loss_correlation_pct=25))
    assert correlated == {"correlations"}
    # corrupt's correlation makes tc send the attribute, with the loss correlation 0: the old 25% is gone
    after = kept_after(correlated, LinkParams(loss_pct=1, corrupt_pct=1, corrupt_correlation_pct=5))
    assert after == {"corrupt"} and stale_after_change(after, LinkParams(loss_pct=1)) == ("corrupt",)
    assert kept_after(correlated, LinkParams(delay_ms=5)) == correlated  # not sent: still held


def test_the_tc_backend_reinstalls_netem_to_drop_a_table_a_change_would_keep():
    from topology import naming
    from topology.shaping import TcBackend

    ran: list[list[str]] = []
    backend = TcBackend(lambda host, argv: ran.append(argv) or "")  # the commands, not root's tc
    pareto = LinkParams(delay_ms=30, jitter_ms=5, delay_distribution="pareto")
    backend.start(pareto, LinkParams())
    dev = naming.wan_interfaces()["a_to_b"][1]
    verbs = lambda: [(argv[2], argv[4]) for argv in ran[2:]]  # noqa: E731  (after start's two installs)
    backend.apply("a_to_b", LinkParams(delay_ms=30))  # no jitter: the table is kept, unused
    assert verbs() == [("change", dev)]
    backend.apply("a_to_b", LinkParams(delay_ms=30, jitter_ms=5))  # uniform jitter: pareto's table would be drawn
    assert verbs()[1:] == [("del", dev), ("replace", dev)]
    backend.apply("a_to_b", LinkParams(delay_ms=30, jitter_ms=8))  # nothing loaded any more: a plain change
    assert verbs()[3:] == [("change", dev)]
    backend.apply("a_to_b", LinkParams(delay_ms=30, corrupt_pct=5, rate_mbit=100))
    backend.apply("a_to_b", LinkParams(delay_ms=30, rate_mbit=50))  # corrupt would stay at 5%
    assert verbs()[4:] == [("change", dev), ("del", dev), ("replace", dev)]
    backend.apply("a_to_b", LinkParams(delay_ms=30, rate_mbit=80))
    assert verbs()[7:] == [("change", dev)]
