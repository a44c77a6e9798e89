"""The MD's recompute of tokens handed over by ID (pure logic: decode steps that record extends)."""

import threading
from types import SimpleNamespace

import grpc
import pytest

from workers.roles import handoff
from workers.roles.handoff import Diverged, MDHandoff

PROMPT = (1, 2, 3)


class _Engine:
    def __init__(self, held: tuple[int, ...]):
        self.seq, self.extended = list(PROMPT + held), []

    def tokens(self, rid):
        return tuple(self.seq)

    def extend(self, rid, ids):  # as DecodeSteps.extend: steps it took
        self.extended.append(list(ids))
        self.seq += ids
        return 1


def _md(held: tuple[int, ...]):
    md = MDHandoff()
    md.engine = md.steps = _Engine(held)
    md.lock = threading.Lock()
    session = SimpleNamespace(request_id="r", prompt_len=len(PROMPT))
    return md, session


def test_the_overlap_is_checked_and_only_the_rest_recomputed():
    md, s = _md(held=(7, 8))  # output indices 0 and 1 held here
    assert md._recompute(s, [8, 9, 10], start=1, held_to=2) == ([9, 10], 1)
    assert md.engine.extended == [[9, 10]]
    assert md._recompute(s, [7], start=0, held_to=1) == ([], 0) and md.engine.extended == [[9, 10]]  # nothing new


def test_a_token_that_differs_is_named_with_its_index_and_nothing_is_extended():
    md, s = _md(held=(7, 8))
    with pytest.raises(Diverged) as err:
        md._recompute(s, [7, 5, 6], start=0, held_to=2)
    assert (err.value.index, err.value.mine, err.value.theirs) == (1, 8, 5)
    with pytest.raises(Diverged) as short:  # the relay's output ends before what this worker holds
        md._recompute(s, [7], start=0, held_to=2)
    assert (short.value.index, short.value.mine, short.value.theirs) == (1, 8, None)
    assert md.engine.extended == []


class _Cancelled(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "Channel closed!"


class _Events:
    def __init__(self):
        self.emitted = []

    def emit(self, event, rid, **fields):
        self.emitted.append(event)


def _md_telling_the_relay(cancelled: bool):
    md = MDHandoff()
    md.events = _Events()
    md.channels = SimpleNamespace(get=lambda address: None)
    md.me = SimpleNamespace(name="md1")
    request = SimpleNamespace(relay_grpc="rld1:50051")
    session = SimpleNamespace(request_id="r", request=request, cancelled=cancelled, relay_lost=False, emit_from=0)
    return md, session


def test_a_kv_ready_that_fails_after_the_request_ended_is_no_lost_relay(monkeypatch):
    """A WAN copy that lands after the RLD finished the request: the MD's KVReady fails as its channel closes
    (CANCELLED, 'Channel closed!'); one wan-lossy run counted that request under relay_lost as well as under
    completed_on_rld."""

    def kv_ready(request, **kw):
        raise _Cancelled()

    monkeypatch.setattr(handoff.pdd_pb2_grpc, "DecodeStub", lambda channel: SimpleNamespace(KVReady=kv_ready))
    md, session = _md_telling_the_relay(cancelled=True)
    assert md._await_handoff(session) is False
    assert md.events.emitted == [] and not session.relay_lost
    md, session = _md_telling_the_relay(cancelled=False)  # a live request: the relay really is gone
    assert md._await_handoff(session) is True
    assert md.events.emitted == ["relay_lost"] and session.relay_lost
