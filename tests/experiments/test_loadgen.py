"""The load generator's turn chaining: a failed turn's successors go out with the reference reply, and
nothing is sent past the issue deadline (the rest is recorded as not issued). Pure logic: a recording
client stands in for the gRPC one."""

import json
import threading
import time

from experiments.loadgen import Client, Recorder, _run_chain, read_reference
from experiments.workload import WorkloadRequest


def req(rid, turn, after=None, head=(1, 2), arrival_s=0.0, think_s=0.0):
    return WorkloadRequest(rid, "s01", turn, "agent", 4, arrival_s, after, think_s, tuple(head), len(head), 0)


def test_a_failed_turn_is_followed_with_the_reference_reply(tmp_path):
    ref = tmp_path / "colocated.jsonl"
    ref.write_text(
        json.dumps(
            {"request_id": "r1", "error": None, "prompt": [1, 2], "tokens": [[1, 8, "rld1", 0, 0], [0, 7, "p1", 0, 0]]}
        )
        + "\n"
        + json.dumps({"request_id": "r9", "error": "UNAVAILABLE", "prompt": [5], "tokens": []})
        + "\n"
    )
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
        self.rec.write({"request_id": r.request_id, "error": f"not issued: {reason}", "issued": False})


def test_nothing_is_sent_past_the_issue_deadline(tmp_path, capsys):
    rec = Recorder(tmp_path / "client.jsonl", 4)
    client = Sent(rec)
    chain = [req("r1", 1), req("r2", 2, after="r1"), req("r3", 3, after="r2", think_s=0.5), req("r4", 4, after="r3")]
    _run_chain(client, chain, time.monotonic_ns(), threading.Event(), issue_until_s=0.3)
    assert client.sent == ["r1", "r2"]
    rows = [json.loads(x) for x in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert [r["request_id"] for r in rows] == ["r3", "r4"] and not any(r["issued"] for r in rows)
    assert rec.not_issued == 2 and rec.failed == 0
    assert "not_issued=2" in capsys.readouterr().out
