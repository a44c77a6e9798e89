"""iperf3 command lines and the receiver's goodput read from a report (pure parts of topology.iperf)."""

import pytest

from topology import iperf


def _interval(start, seconds, mbit):
    return {"sum": {"start": start, "end": start + seconds, "seconds": seconds, "bytes": int(mbit * 1e6 / 8 * seconds)}}


def _report(intervals, sum_received_mbit=99.0):
    return {
        "end": {"sum_received": {"bits_per_second": sum_received_mbit * 1e6}},
        "server_output_json": {"intervals": intervals},
    }


def test_client_runs_the_warmup_too_and_asks_for_the_servers_report():
    argv = iperf.client_argv("10.0.0.2", 6, port=5301, warmup_s=2)
    assert argv[argv.index("-t") + 1] == "8"
    assert "--get-server-output" in argv and "-J" in argv and "-O" not in argv
    assert argv[argv.index("-p") + 1] == "5301"


def test_udp_client_sets_rate_and_datagram_size():
    argv = iperf.client_argv("10.0.0.2", 5, udp_mbit=10)
    assert argv[argv.index("-b") + 1] == "10M" and "-u" in argv and argv[argv.index("-l") + 1] == "1400"


def test_server_reports_in_json():
    assert iperf.server_argv(5301, bind="10.0.0.2") == ["iperf3", "-s", "-1", "-J", "-p", "5301", "-B", "10.0.0.2"]


def test_mean_goodput_is_the_servers_bytes_over_its_seconds_after_the_warmup():
    intervals = [_interval(0, 1.0, 8.5), _interval(1.00001, 1.0, 19.1), _interval(2.00002, 1.0, 19.1)]
    intervals += [_interval(3.00003, 0.22, 19.1)]
    report = _report(intervals, sum_received_mbit=20.06)
    assert iperf.receiver_mbit(report, warmup_s=1) == pytest.approx(19.1, rel=1e-4)
    assert iperf.receiver_mbit(report) < 19.1  # the slow-start second counts without a warm-up


def test_steady_goodput_is_not_moved_by_a_recovery_burst():
    # Measured on the 20 Mbit/s line: bytes held behind a slow-start loss arrive in one burst.
    rates = [8.53, 11.21, 26.96, 19.13, 19.13, 19.13, 19.13, 19.13]
    intervals = [_interval(i * 1.00001, 1.0, r) for i, r in enumerate(rates)] + [_interval(8.0, 0.2, 40.0)]
    report = _report(intervals)
    assert iperf.receiver_mbit(report, warmup_s=2) > 20  # the mean over the window passes the wire's ceiling
    assert iperf.steady_mbit(report, warmup_s=2) == pytest.approx(19.13, rel=1e-4)


def test_steady_goodput_sees_a_link_that_passes_too_much():
    report = _report([_interval(i * 1.00001, 1.0, 20.3) for i in range(6)])
    assert iperf.steady_mbit(report, warmup_s=2) == pytest.approx(20.3, rel=1e-4)


def test_goodput_needs_the_servers_report():
    with pytest.raises(iperf.IperfReportError, match="get-server-output"):
        iperf.receiver_mbit({"end": {"sum_received": {"bits_per_second": 1e6}}})


def test_goodput_needs_an_interval_after_the_warmup():
    with pytest.raises(iperf.IperfReportError, match="warm-up"):
        iperf.receiver_mbit(_report([_interval(0, 1.0, 10)]), warmup_s=2)
