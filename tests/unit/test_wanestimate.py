"""The WAN estimate from TCP_INFO samples, and the route decision it drives (policy.wan_estimate).
Pure logic: samples are built by hand."""

import dataclasses
import math

from workers.kvwire.tcpinfo import parse_tcp_info
from workers.roles.config import RouterPolicy
from workers.roles.routing import decide_route
from workers.roles.wanestimate import WanEstimate, WanEstimator

BLANK = parse_tcp_info(b"")


def sample(rate_mbit: float, rtt_ms: float, min_rtt_ms: float, app_limited: bool = False):
    return dataclasses.replace(
        BLANK,
        delivery_rate=int(rate_mbit * 1e6 / 8),
        rtt_us=int(rtt_ms * 1000),
        min_rtt_us=int(min_rtt_ms * 1000),
        app_limited=app_limited,
    )


def test_rate_counts_every_connection_and_ignores_app_limited_samples():
    est = WanEstimator()
    assert not est.estimate().measured
    est.observe(sample(50, 62, 60), connections=2)
    est.observe(sample(5, 62, 60, app_limited=True), connections=2)  # a lower bound only
    e = est.estimate()
    assert e.measured and math.isclose(e.rate_mbit, 100, rel_tol=1e-6) and e.min_rtt_ms == 60
    assert not e.congested
    assert math.isclose(e.transfer_ms(1_250_000), 100 + e.rtt_ms / 2)  # 10 Mbit at 100 Mbit/s + one way


def test_queue_build_up_or_loss_reads_as_congested():
    est = WanEstimator()
    est.observe(sample(20, 61, 60), 2)
    for _ in range(10):  # the queue fills: RTT 60 -> 200 ms
        est.observe(sample(20, 200, 60), 2)
    assert est.estimate().congested and est.estimate().rtt_ms > 150
    lossy = WanEstimator()
    lossy.observe(sample(20, 61, 60), 2)
    lossy.observe_transfer(segments_sent=1000, segments_retransmitted=50)  # 5% retransmitted
    assert lossy.estimate().congested and math.isclose(lossy.estimate().retrans_pct, 5.0)


def test_measured_routing_backs_off_when_congested_and_static_ignores_the_measurement():
    static, measured = (
        RouterPolicy(direct_max_transfer_ms=40),
        RouterPolicy(direct_max_transfer_ms=40, wan_estimate="measured"),
    )
    quiet = WanEstimate(rate_mbit=200, rtt_ms=61, min_rtt_ms=60, samples=5)
    busy = WanEstimate(rate_mbit=200, rtt_ms=300, min_rtt_ms=60, samples=5)
    slow = WanEstimate(rate_mbit=2, rtt_ms=1, min_rtt_ms=1, samples=5)
    # 10 uncached tokens of 512 B: 0.2 ms at the static 200 Mbit/s
    assert decide_route("pdd", 100, 16, 90, 512, static, busy).route == "p-md"
    d = decide_route("pdd", 100, 16, 90, 512, measured, busy)
    assert d.route == "p-rld-md" and math.isinf(d.wan_estimate_ms) and d.wan_source == "measured"
    assert decide_route("pdd", 100, 16, 90, 512, measured, slow).route == "p-md"  # 20.5 + 0.5 ms
    assert decide_route("pdd", 100, 16, 90, 5120, measured, slow).route == "p-rld-md"  # 205 ms at 2 Mbit/s
    quiet_d = decide_route("pdd", 100, 16, 90, 512, measured, quiet)
    assert quiet_d.route == "p-md" and math.isclose(quiet_d.wan_estimate_ms, 0.2048 + 30.5)
    far = WanEstimate(rate_mbit=200, rtt_ms=90, min_rtt_ms=88, samples=5)  # 45 ms one way > 40
    assert decide_route("pdd", 100, 16, 90, 512, measured, far).route == "p-rld-md"
    assert decide_route("pdd", 100, 16, 90, 512, measured, None).wan_source == "static"  # nothing measured yet
