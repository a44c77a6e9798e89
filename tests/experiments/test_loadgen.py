"""The load generator's turn chaining: a failed turn's successors go out with the reference reply, and
nothing is sent past the issue deadline (the rest is recorded as not issued). Pure logic: a recording
client stands in for the gRPC one."""

import threading
import time

from experiments.rundir import clientlog
from experiments.rundir.clientlog import TokenRow
from experiments.run.loadgen import Client, Recorder, _run_chain, read_reference
from experiments.spec.workload import WorkloadRequest


def req(rid, turn, after=None, head=(1, 2), arrival_s=0.0, think_s=0.0):
    return WorkloadRequest(rid, "s01", turn, "agent", 4, arrival_s, after, think_s, tuple(head), len(head), 0)


def record(r: WorkloadRequest, prompt=(), tokens=(), error=None) -> clientlog.ClientRecord:
    rec = clientlog.new_record(r.request_id, "colocated", "colocated", r.session, r.turn, r.kind, 4, prompt, 0)
    rec.tokens, rec.error = list(tokens), error
    return rec


def test_a_failed_turn_is_followed_with_the_reference_reply(tmp_path):
    ref = tmp_path / "colocated.jsonl"
    ok = record(req("r1", 1), [1, 2], [TokenRow(1, 8, "rld1", 0, 0), TokenRow(0, 7, "p1", 0, 0)])
    failed = record(req("r9", 1), [5], error="UNAVAILABLE")
    ref.write_text(clientlog.line(ok) + clientlog.line(failed))
    reference = read_reference(ref)
    assert reference == {"r1": ((1, 2), (7, 8))}
    client = Client.__new__(Client)
    client.outputs, client.reference = {}, reference
    assert client.prompt_of(req("r2", 2, after="r1", head=(3,))) == ((1, 2, 7, 8, 3), "reference")
    client.outputs["r1"] = ((1, 2), (7, 9))  # this variant's own reply wins when it has one
    assert client.prompt_of(req("r2", 2, after="r1", head=(3,))) == ((1, 2, 7, 9, 3), "previous")
    assert client.prompt_of(req("r3", 3, after="r2")) == (None, "none")


class Sent:
    def __init__(self, rec):
        self.rec, self.sent = rec, []

    def send(self, r, t0_ns):
        self.sent.append(r.request_id)
        time.sleep(0.05)
        return True

    def not_issued(self, r, t0_ns, reason):
        rec = record(r, error=f"not issued: {reason}")
        rec.issued = False
        self.rec.write(rec)


def test_nothing_is_sent_past_the_issue_deadline(tmp_path, capsys):
    rec = Recorder(tmp_path / "client.jsonl", 4)
    client = Sent(rec)
    chain = [req("r1", 1), req("r2", 2, after="r1"), req("r3", 3, after="r2", think_s=0.5), req("r4", 4, after="r3")]
    _run_chain(client, chain, time.monotonic_ns(), threading.Event(), issue_until_s=0.3)
    assert client.sent == ["r1", "r2"]
    rows = clientlog.read(tmp_path / "client.jsonl")
    assert [r.request_id for r in rows] == ["r3", "r4"] and not any(r.issued for r in rows)
    assert rec.not_issued == 2 and rec.failed == 0
    assert "not_issued=2" in capsys.readouterr().out


def test_settle_waits_for_an_md_holding_the_whole_warmup_prefix():
    from experiments.run.loadgen import settle

    hits = iter([0, 0, 32, 96, 96])
    other = iter([0] * 5)
    now = iter(range(100))
    s = settle([lambda: next(hits), lambda: next(other)], want=96, timeout_s=50, poll_s=0, clock=lambda: next(now))
    assert (s.ok, s.cached, s.want, s.wait_s) == (True, 96, 96, 4)  # the 4th poll, 4 ticks on


def test_settle_gives_up_at_its_timeout_and_says_so():
    from experiments.run.loadgen import settle
    from experiments.run.runner import _settled

    now = iter(range(100))
    s = settle([lambda: 48], want=96, timeout_s=5, poll_s=0, clock=lambda: next(now))
    assert (s.ok, s.cached, s.wait_s) == (False, 48, 5)
    back = _settled(s.line())  # the runner's reading of the loadgen's line
    assert (back.ok, back.wait_s, back.cached_tokens, back.want_tokens) == (False, 5.0, 48, 96)


def test_drc_blocks_counts_whole_blocks_short_of_the_last_token():
    from experiments.run.loadgen import drc_blocks

    assert [drc_blocks(n, 16) for n in (0, 1, 16, 17, 33, 512)] == [0, 0, 0, 16, 32, 496]


def test_summary_says_how_long_each_clock_waited_for_the_warmup_prefix():
    from types import SimpleNamespace

    from experiments.rundir.metadata import VariantRecord, WarmupSettle
    from experiments.analysis.summary_pdd import _settle_lines

    ok = WarmupSettle(ok=True, wait_s=22.16, cached_tokens=512, want_tokens=512)
    late = WarmupSettle(ok=False, wait_s=75.0, cached_tokens=0, want_tokens=512)
    variants = {
        "colocated": VariantRecord(status="ok"),
        "pdd": VariantRecord(status="ok", warmup_settle=ok),
        "pdd-b": VariantRecord(status="ok", warmup_settle=late),
    }
    text = "\n".join(_settle_lines(SimpleNamespace(variants=variants)))
    assert "- pdd: in the DRC 22.2 s after" in text
    assert "- pdd-b: NOT in the DRC after 75.0 s (settle timeout; 0 of 512 tokens)" in text
    assert "colocated" not in text
    assert _settle_lines(SimpleNamespace(variants={"colocated": variants["colocated"]})) == []


def test_only_pdd_waits_for_the_warmup_prefix_at_its_mds():
    """pd-cross's MD keeps no DRC (its requests do not use it): waiting there would only run out the timeout."""
    from types import SimpleNamespace

    from experiments.run.deploy import grpc_address
    from experiments.run.runner import _settle_args
    from experiments.spec.experiment import load_spec

    spec = load_spec("pdd-smoke", ["pools.md.workers=2"])
    runtime = SimpleNamespace(workers=["md1", "md2", "rld1", "p1", "router"], address=grpc_address)
    args = _settle_args(spec, "pdd", runtime)
    assert args[args.index("--settle") + 1 :] == ["10.2.0.61:50053", "10.2.0.62:50053"]
    assert args[args.index("--block-size") + 1] == str(spec.block_size)
    timeout = float(args[args.index("--settle-timeout-s") + 1])
    assert timeout == min(spec.timeouts.request_s, spec.timeouts.variant_s / 4)
    assert [_settle_args(spec, v, runtime) for v in ("colocated", "pd-intra", "pd-cross")] == [[], [], []]
    no_warmup = load_spec("pdd-smoke", ["workload.warmup=false"])
    assert _settle_args(no_warmup, "pdd", runtime) == []
