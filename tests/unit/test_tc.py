"""tc command builders: the argv for each kind of impairment, without touching the system."""

from topology.profiles import GilbertElliott, LinkParams
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
