"""The MD killed while it decodes a pdd request (after the RLD handed over, or on the P->MD route): the
router resumes the request on the RLD from the tokens the client already has (by their IDs), and it
completes with the greedy reference's tokens; roles as processes on loopback."""

import pytest

from pdd_harness import running
from test_roles import check_reference, check_stream, events_of, fresh_prompt, wait_for
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.client import wait_healthy

N = 100  # prompt + N within the tiny model's context (128): the MD has ~95 tokens to decode when it is killed


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    with running(tmp_path_factory.mktemp("md-after-handoff")) as dep:
        yield dep


def _rld_done(dep, rid: str) -> bool:
    """The RLD's session ended (after a handoff: the handoff RPC returned, so the RLD will not carry on
    itself, as it does when the MD fails during the handoff)."""
    return bool(events_of(dep, "rld1", rid, "decode_close"))


def generate_killing_md(dep, prompt: list[int], rid: str, rld_session: bool) -> tuple[list, pdd_pb2.GenerateDone, int]:
    """Stream one pdd request; SIGKILL the MD once the client holds its first token and the RLD's session
    (if any) ended. Returns the tokens, the done message and the client's last index before the kill."""
    stub = pdd_pb2_grpc.RouterStub(dep.channel)
    tokens, done, killed_at = [], None, None
    req = pdd_pb2.GenerateRequest(request_id=rid, prompt_tokens=prompt, max_tokens=N, mode="pdd")
    for ev in stub.Generate(req, timeout=120):
        if ev.WhichOneof("kind") != "token":
            done = ev.done
            continue
        tokens.append(ev.token)
        if ev.token.worker == "md1" and killed_at is None:
            if rld_session:
                wait_for(lambda: _rld_done(dep, rid), timeout_s=5, poll_s=0.002, what="the RLD's session to end")
            dep.kill("md")
            killed_at = ev.token.index
    return tokens, done, killed_at


class _Gen:
    def __init__(self, tokens, done):
        self.tokens, self.done, self.ids = tokens, done, [t.token for t in tokens]


@pytest.mark.parametrize(
    ("prompt_len", "route"),
    [(16, "p-rld-md"), (6, "p-md")],  # 8 KB over direct_max_transfer_ms at 200 Mbit/s, 3 KB under
)
def test_the_md_killed_while_it_decodes_resumes_on_the_rld(dep, reference, prompt_len, route):
    if dep.proc("md").poll() is not None:  # the previous case killed it
        dep.start_role("md")
        wait_healthy(dep.cfg.md[0].grpc_address, timeout_s=90)
    prompt, rid = fresh_prompt(prompt_len), f"resume-{route}"
    tokens, done, killed_at = generate_killing_md(dep, prompt, rid, rld_session=route == "p-rld-md")
    gen = _Gen(tokens, done)
    assert killed_at is not None, f"the MD never decoded: {[t.worker for t in tokens]}"
    check_stream(gen, N, repeats_allowed=True)
    check_reference(reference, prompt, gen.ids, N, f"MD killed at token {killed_at} ({route})")
    assert done.route == route, done
    (resumed,) = events_of(dep, "router", rid, "resumed_on_rld")
    n = resumed.fields["from_index"]
    print(f"{route}: MD killed when the client had its token {killed_at}; resumed on the RLD from {n}")
    assert killed_at < n < N, (killed_at, n)  # the MD was killed mid-decode; the RLD took the rest
    workers = [t.worker for t in tokens]
    assert set(workers[killed_at:n]) == {"md1"} and set(workers[n:]) == {"rld1"}, workers
    # the RLD recomputed prompt + the n tokens by their IDs (one local prefill) and decoded N - n more
    (arrival,) = [e for e in events_of(dep, "rld1", rid, "decode_arrival") if e.fields["max_tokens"] == N - n]
    assert arrival.fields["prompt_tokens"] == prompt_len + n
