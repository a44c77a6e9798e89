"""The LAN's token bucket on a kernel without netem: the tc commands, the bucket's size, and the refusals."""

import dataclasses

import pytest

from topology import lan_tbf
from topology.netem_options import Slot
from topology.profiles import FRAME_BYTES, PACKET_IMPAIRMENTS, TIMING, LinkParams, load_profile


def test_the_lan_profile_gets_its_rate_and_netems_queue_on_one_interface():
    lan = load_profile("lan").a_to_b  # 10000 Mbit/s, 0.02 ms
    assert lan_tbf.tbf_cmds("p1-eth0", lan) == [
        ["tc", "qdisc", "replace", "dev", "p1-eth0", "root", "handle", "1:",
         "tbf", "rate", "10000000000bit", "burst", "1250000", "limit", str(1000 * FRAME_BYTES)],
        ["tc", "qdisc", "replace", "dev", "p1-eth0", "parent", "1:1", "handle", "10:", "pfifo", "limit", "1000"],
    ]  # fmt: skip
    assert lan_tbf.refusal(lan) is None


@pytest.mark.parametrize(
    "rate_mbit, burst",
    [(10000, 1_250_000), (1000, 125_000), (50, 6250), (20, 2 * FRAME_BYTES), (1, 2 * FRAME_BYTES)],
)
def test_the_bucket_holds_a_millisecond_at_the_rate_and_never_less_than_two_frames(rate_mbit, burst):
    assert lan_tbf.burst_bytes(rate_mbit) == burst


def test_an_explicit_queue_and_a_packet_overhead_are_tbfs_and_pfifos():
    p = LinkParams(rate_mbit=50, rate_packet_overhead_bytes=24, limit_pkts=200)
    tbf, fifo = lan_tbf.tbf_cmds("pdd-sa-eth3", p)
    assert tbf[-6:] == ["burst", "6250", "limit", str(200 * FRAME_BYTES), "overhead", "24"]
    assert fifo[-3:] == ["pfifo", "limit", "200"]
    assert lan_tbf.refusal(p) is None


def test_no_rate_installs_nothing():
    assert lan_tbf.tbf_cmds("p1-eth0", LinkParams(delay_ms=0.02, limit_pkts=50)) == []
    assert lan_tbf.describe(LinkParams()) == "no rate limit; no delay added"


def test_metadata_says_what_was_applied_and_that_the_delay_is_the_veths():
    text = lan_tbf.describe(load_profile("lan").a_to_b)
    assert text.startswith("tbf 10000 Mbit/s (burst 1250000 B = 1 ms at the rate; pfifo of 1000 packets)")
    assert "delay 0.02 ms not added: met by the veth path's own one-way latency" in text


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"loss_pct": 1.0}, "loss_pct = 1.0"),
        ({"jitter_ms": 0.01}, "jitter_ms = 0.01"),
        ({"duplicate_pct": 0.5}, "duplicate_pct = 0.5"),
        ({"corrupt_pct": 0.1}, "corrupt_pct = 0.1"),
        ({"delay_ms": 1.0, "reorder_pct": 5.0}, "reorder_pct = 5.0"),
        ({"delay_ms": 0.2}, "delay_ms = 0.2 (above the veth path's own 0.05 ms)"),
        ({"rate_cell_bytes": 53}, "rate_cell_bytes = 53"),
        ({"rate_packet_overhead_bytes": -4}, "rate_packet_overhead_bytes = -4 (tbf's overhead is 0..65535)"),
        ({"slot": Slot(delay_ms=1.0, max_delay_ms=2.0)}, "slot = Slot("),
    ],
)
def test_what_needs_netem_is_refused_naming_the_field_and_the_tc_backend(changes, named):
    message = lan_tbf.refusal(LinkParams(rate_mbit=50).replace(**changes))
    assert named in message
    assert "only netem applies" in message and "tc backend" in message and "make vm-test" in message


def test_one_message_names_every_field_refused():
    message = lan_tbf.refusal(LinkParams(rate_mbit=50, delay_ms=1.0, jitter_ms=0.5, loss_pct=1.0))
    assert "delay_ms = 1 (above" in message and "jitter_ms = 0.5" in message and "loss_pct = 1.0" in message


def test_a_delay_up_to_the_veth_paths_own_is_met_not_refused():
    assert lan_tbf.refusal(LinkParams(delay_ms=lan_tbf.VETH_BASE_ONE_WAY_MS)) is None


def test_every_field_is_applied_or_refused():
    """A field netem gains is refused until a token bucket is taught it: none slips through unapplied."""
    names = {f.name for f in dataclasses.fields(LinkParams)}
    assert set(lan_tbf.APPLIED) <= names == set(PACKET_IMPAIRMENTS) | set(TIMING)


def test_a_benchmark_may_size_the_bucket_in_seconds():
    assert lan_tbf.burst_bytes(1000, burst_s=0.004) == 500_000
    assert lan_tbf.tbf_cmds("a0", LinkParams(rate_mbit=1000), burst_s=0.0)[0][11:13] == ["burst", "3028"]
