"""Cross traffic, pure parts: validation, runs and ports, iperf3 command lines, JSON reading, Jain's index."""

import json
import math

import pytest

from experiments.analysis import crosstraffic as results
from experiments.spec import crosstraffic as ct
from experiments.spec.crosstraffic import CrossFlow, CrossTrafficError
from experiments.rundir.metadata import RunMetadata, VariantRecord

RATES = {"a_to_b": 20.0, "b_to_a": 50.0}
CCS = ("reno", "bbr")


def _validate(*flows, window_s=60.0):
    ct.validate_flows(tuple(flows), RATES, window_s, CCS)


def test_jain_index_equal_shares_and_one_hog():
    assert results.jain_index([5.0, 5.0, 5.0, 5.0]) == pytest.approx(1.0)
    assert results.jain_index([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert results.jain_index([3.0, 1.0]) == pytest.approx(16 / 20)
    assert math.isnan(results.jain_index([])) and math.isnan(results.jain_index([0.0, 0.0]))
    with pytest.raises(ValueError):
        results.jain_index([1.0, -1.0])


@pytest.mark.parametrize(
    "flow, needle",
    [
        (
            CrossFlow("tcp", 5, congestion="vegas"),
            "[0].congestion='vegas' is not offered by this kernel; allowed: ['reno', 'bbr']",
        ),
        (CrossFlow("udp", 5), "[0].rate_mbit: required for udp flows"),
        (CrossFlow("udp", 5, rate_mbit=30), "[0].rate_mbit=30 exceeds the link's a_to_b rate; allowed: (0, 20]"),
        (CrossFlow("udp", 5, rate_mbit=30, direction="both"), "exceeds the link's a_to_b rate"),
        (CrossFlow("udp", 5, rate_mbit=5, congestion="bbr"), "only for tcp flows"),
        (
            CrossFlow("tcp", 30, start_s=40),
            "start_s + duration_s = 70 s lies beyond timeouts.variant_s=60; allowed: start_s + duration_s <= 60",
        ),
        (CrossFlow("tcp", 2.5), "[0].duration_s=2.5: allowed: a whole number of seconds >= 1"),
        (CrossFlow("tcp", 5, streams=0), "[0].streams=0 out of range [1, 128]"),
        (CrossFlow("tcp", 5, start_s=-1), "[0].start_s=-1 out of range [0, 60.0]"),
        (CrossFlow("tcp", 5, name="a b"), "[0].name='a b': allowed: 1-40 letters"),
    ],
)
def test_bad_flows_are_refused_with_the_field_and_allowed_values(flow, needle):
    with pytest.raises(CrossTrafficError) as err:
        _validate(flow)
    assert needle in str(err.value) and str(err.value).startswith("cross_traffic[0]")


@pytest.mark.parametrize(
    "entry, needle",
    [
        ({"kind": "sctp", "duration_s": 5}, "cross_traffic[0].kind='sctp'; allowed: ['tcp', 'udp']"),
        (
            {"kind": "tcp", "duration_s": 5, "direction": "up"},
            "cross_traffic[0].direction='up'; allowed: ['a_to_b', 'b_to_a', 'both']",
        ),
    ],
)
def test_kind_and_direction_are_refused_when_the_entry_is_read(entry, needle):
    from schema import build

    with pytest.raises(CrossTrafficError) as err:
        build(CrossFlow, entry, "cross_traffic[0]", CrossTrafficError)
    assert str(err.value) == needle


def test_names_must_be_unique_and_default_to_kind_and_index():
    with pytest.raises(CrossTrafficError, match=r"cross_traffic\[1\].name='tcp0' is used twice"):
        _validate(CrossFlow("tcp", 5), CrossFlow("tcp", 5, name="tcp0"))
    _validate(CrossFlow("tcp", 5), CrossFlow("udp", 5, rate_mbit=10, direction="b_to_a"))  # tcp0, udp1


def test_expand_gives_each_direction_its_own_port_and_hosts():
    runs = ct.expand((CrossFlow("tcp", 5, direction="both", name="bulk"), CrossFlow("udp", 5, rate_mbit=5)))
    assert [(r.name, r.direction, r.port, r.sender.name, r.receiver.name, r.file_name) for r in runs] == [
        ("bulk", "a_to_b", 5301, "xa", "xb", "bulk-a_to_b.json"),
        ("bulk", "b_to_a", 5302, "xb", "xa", "bulk-b_to_a.json"),
        ("udp1", "a_to_b", 5303, "xa", "xb", "udp1-a_to_b.json"),
    ]
    assert ct.last_event_s((CrossFlow("tcp", 5, start_s=20), CrossFlow("tcp", 3))) == 25


def test_command_lines():
    tcp, udp = ct.expand(
        (
            CrossFlow("tcp", 20, streams=2, congestion="bbr"),
            CrossFlow("udp", 4, direction="b_to_a", rate_mbit=10, streams=4),
        )
    )
    assert ct.server_cmd(tcp) == ["iperf3", "-s", "-1", "-p", "5301", "-B", "10.2.0.90"]
    assert ct.client_cmd(tcp, "/r/x.json") == [
        "iperf3",
        "-c",
        "10.2.0.90",
        "-B",
        "10.1.0.90",
        "-p",
        "5301",
        "-t",
        "20",
        "-P",
        "2",
        "-J",
        "--logfile",
        "/r/x.json",
        "-C",
        "bbr",
    ]
    # iperf3's -b is per stream: 10 Mbit/s over 4 streams is 2.5 each.
    argv = ct.client_cmd(udp, "u.json")
    assert argv[:4] == ["iperf3", "-c", "10.1.0.90", "-B"] and argv[argv.index("-b") + 1] == "2.5M"
    assert "-u" in argv and "-C" not in argv and argv[argv.index("-p") + 1] == "5304"


def _iperf_doc(kind, received_mbit, sent_intervals, streams=(), error=None):
    end = {
        "sum_sent": {"bytes": 1, "bits_per_second": 1e6, "retransmits": 7},
        "sum_received": {
            "bytes": int(received_mbit * 1e5),
            "bits_per_second": received_mbit * 1e6,
            "lost_percent": 1.5,
        },
        "streams": [{"receiver": {"bytes": 1, "bits_per_second": m * 1e6}, "sender": {}} for m in streams],
    }
    doc = {
        "intervals": [{"sum": {"start": s, "end": e, "bits_per_second": m * 1e6}} for s, e, m in sent_intervals],
        "end": end,
    }
    if error:
        doc["error"] = error
    return doc


def test_parse_a_complete_tcp_run_uses_the_receiver():
    r = results.parse_result(_iperf_doc("tcp", 80.0, [(0, 1, 60.0), (1, 2, 100.0)], streams=(30.0, 50.0)), "tcp")
    assert (r.mean_mbit, r.retransmits, r.lost_pct, r.error) == (80.0, 7, None, None)
    assert r.intervals == ((0.0, 1.0, 60.0), (1.0, 2.0, 100.0)) and r.stream_mbit == (30.0, 50.0)


def test_parse_a_cut_run_falls_back_to_its_intervals():
    doc = _iperf_doc("tcp", 0.0, [(0, 1, 60.0), (1, 1.5, 90.0)], error="interrupt - the client has terminated")
    r = results.parse_result(doc, "tcp")
    assert r.mean_mbit == pytest.approx((60 + 0.5 * 90) / 1.5) and r.error.startswith("interrupt")


def test_parse_udp_reports_loss():
    r = results.parse_result(_iperf_doc("udp", 9.5, [(0, 1, 10.0)]), "udp")
    assert (r.mean_mbit, r.retransmits, r.lost_pct) == (9.5, None, 1.5)


def test_summarize_a_run_directory(tmp_path):
    cross = tmp_path / "variants" / "pdd" / "cross"
    cross.mkdir(parents=True)
    entries = []
    for i, (name, mbit) in enumerate((("a", 30.0), ("b", 10.0))):
        (cross / f"{name}-a_to_b.json").write_text(json.dumps(_iperf_doc("tcp", mbit, [(0, 1, mbit)], (mbit,))))
        run = ct.expand((CrossFlow("tcp", 1, name=name),))[0]
        entries.append(ct.metadata_entry(run, 10 + i, 20 + i, f"variants/pdd/cross/{name}-a_to_b.json", "bbr"))
    entries.append(entries[0].model_copy(update={"name": "gone", "iperf_json": "variants/pdd/cross/gone-a_to_b.json"}))
    meta = RunMetadata.model_construct(
        variants={"pdd": VariantRecord(status="ok", cross_traffic=entries), "pd-intra": VariantRecord(status="ok")}
    )
    s = results.summarize(tmp_path, meta)
    assert list(s) == ["pdd"]
    flows = s["pdd"]["flows"]
    assert flows["a-a_to_b"]["mean_mbit"] == 30.0 and flows["a-a_to_b"]["retransmits"] == 7
    assert flows["a-a_to_b"]["streams_jain_index"] == pytest.approx(1.0)
    assert flows["gone-a_to_b"]["mean_mbit"] is None and "no iperf3 output" in flows["gone-a_to_b"]["error"]
    assert s["pdd"]["jain_index"]["a_to_b"] == pytest.approx(40**2 / (2 * (900 + 100)))


def test_metadata_entry_of_a_udp_flow_has_no_congestion_and_its_rate():
    [run] = ct.expand((CrossFlow("udp", 3, rate_mbit=4),))
    e = ct.metadata_entry(run, 1, 2, "variants/v/cross/udp0-a_to_b.json", None)
    assert (e.kind, e.direction, e.start_ns, e.end_ns, e.congestion, e.rate_mbit) == ("udp", "a_to_b", 1, 2, None, 4)


def test_kernel_congestion_algorithms_read_both_lists(tmp_path):
    (tmp_path / "tcp_available_congestion_control").write_text("reno bbr cubic\n")
    (tmp_path / "tcp_allowed_congestion_control").write_text("reno bbr\n")
    assert ct.kernel_congestion_algorithms(tmp_path) == ("reno", "bbr", "cubic")
    assert ct.kernel_congestion_algorithms(tmp_path / "none") == ()
