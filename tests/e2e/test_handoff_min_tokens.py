"""decode.handoff_min_tokens: the RLD hands over exactly K generated tokens, by IDs and by KV (the handoff
microbenchmark's knob), with the colocated reference's tokens; roles as processes on loopback."""

import pytest

from pdd_harness import running
from test_roles import check_reference, check_stream, events_of, fresh_prompt
from workers.roles.client import generate

K = 24


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    with running(tmp_path_factory.mktemp("min-tokens"), decode={"handoff_min_tokens": K}) as dep:
        yield dep


@pytest.mark.parametrize("handoff", ["oneshot", "kv"])
def test_a_handoff_carries_exactly_k_tokens(dep, reference, handoff):
    # The MD holds the prompt KV within milliseconds on loopback; without the knob it takes over after a
    # token or two (test_roles). With it, the RLD decodes K tokens past P's first before it hands over.
    prompt, n = fresh_prompt(40), K + 8
    gen = generate(dep.channel, prompt, n, mode="pdd", handoff=handoff, request_id=f"min-{handoff}")
    check_stream(gen, n)
    check_reference(reference, prompt, gen.ids, n, f"min-tokens/{handoff}")
    rid = gen.done.request_id
    (end,) = [e for e in events_of(dep, "rld1", rid, "handoff_end") if e.fields["final"]]
    assert end.fields["tokens"] == K + 1  # P's token (the overlap) + the K the RLD generated
    assert gen.workers[: K + 1] == ["p1"] + ["rld1"] * K and set(gen.workers[K + 1 :]) == {"md1"}, gen.workers
    if handoff == "kv":
        (recv,) = events_of(dep, "md1", rid, "kv_recv_end")[-1:]
        assert recv.fields["kind"] == "handoff"
    else:
        (ext,) = events_of(dep, "md1", rid, "extend")
        assert ext.fields["tokens"] == K
