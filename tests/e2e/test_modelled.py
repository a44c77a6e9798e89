"""End-to-end: modelled compute (compute.mode modelled) through the real roles on loopback.

The roles run the real protocol (sessions, both KV paths, handoffs, routing) while their engines wait the
roofline's time of a published architecture instead of computing: every mode returns the same tokens as a
colocated ModelledEngine, and the KV on the wire is the architecture's bytes per token, not the small model's.
"""

import threading

import pytest

from pdd_harness import Deployment
from workers.model import get_config
from workers.modelled.catalogue import load_catalogue, wire_config
from workers.modelled.engine import ModelledEngine
from workers.modelled.roofline import Roofline
from workers.engine import GenerationRequest
from workers.roles.client import generate
from workers.roles.config import ConfigError, parse_config

ARCH, ACCELERATOR, DEVICES = "kimi-k2", "h800", 16  # 1T-class MLA MoE in fp8 on 16 H800s: ~70 KB of KV a token
MODES = ("pd-intra", "pd-cross", "pdd")


def started(tmp_path_factory, name: str, accelerator=ACCELERATOR, devices=DEVICES, **compute):
    """A modelled deployment (ARCH, or compute's arch, on devices x accelerator a worker) started on loopback for a
    module's tests, then stopped with every role exiting 0; compute: further compute fields (kv_scale)."""
    d = Deployment(
        tmp_path_factory.mktemp(name),
        worker_fields={"accelerator": accelerator, "devices": devices},
        compute={"mode": "modelled", "arch": ARCH, **compute},
        model="tiny",
    )
    try:
        yield d.start()
    finally:
        codes = d.stop()
        assert all(c == 0 for c in codes.values()), f"role exit codes {codes}; logs in {d.run_dir}"


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    yield from started(tmp_path_factory, "modelled")


@pytest.fixture(scope="module")
def reference():
    cat = load_catalogue()
    engine = ModelledEngine(
        cat.model(ARCH),
        cat.accelerator(ACCELERATOR),
        devices=DEVICES,
        capacity_tokens=4096,
        block_size=16,
        prefix_cache=False,
        vocab_size=get_config("tiny").vocab_size,
    )
    return lambda prompt, n: list(engine.generate(GenerationRequest("ref", tuple(prompt), n)).output_tokens)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_returns_the_colocated_modelled_tokens(dep, reference, mode):
    prompt = [(7 * i + len(mode)) % 250 for i in range(120)]
    gen = generate(dep.channel, prompt, 12, mode=mode, request_id=f"m-{mode}")
    assert [t.index for t in gen.tokens] == list(range(12))
    assert [t.token for t in gen.tokens] == reference(prompt, 12)


@pytest.mark.parametrize("mode", ("colocated", *MODES))
def test_a_decode_worker_writes_one_first_token_a_request(dep, mode):
    """Each decode worker streaming a request writes one first_token event for it, at the first index it streams
    (0, or an MD's first after a relay's handoff). Before, a worker that sent token 0 itself (a local prompt, or
    P's token after a KV import) wrote another at index 1."""
    rid = f"first-{mode}"
    generate(dep.channel, [(5 * i + len(mode)) % 250 for i in range(90)], 8, mode=mode, request_id=rid)
    written = {
        w.name: [e.fields["index"] for e in dep.events(w.name) if e.event == "first_token" and e.request_id == rid]
        for w in (*dep.cfg.pool("rld"), *dep.cfg.pool("md"))
    }
    streamed = {w: idx for w, idx in written.items() if idx}
    assert streamed and all(len(idx) == 1 for idx in streamed.values()), written
    assert 0 in [i for idx in streamed.values() for i in idx], written


def test_the_wan_carries_the_architectures_kv(dep):
    prompt = [(11 * i + 3) % 250 for i in range(160)]
    generate(dep.channel, prompt, 4, mode="pd-cross", request_id="m-wan")
    [end] = [e for e in dep.events("p1") if e.request_id == "m-wan" and e.event == "kv_send_end"]
    per_token = wire_config(load_catalogue().model(ARCH)).kv_bytes_per_token
    assert per_token == 70_272
    assert end.fields["kv_bytes"] == len(prompt) * per_token, end.fields


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """The same deployment with compute.kv_scale 4: a line scaled down by 4 carries KV scaled down by 4."""
    yield from started(tmp_path_factory, "modelled-scaled", kv_scale=4)


@pytest.mark.parametrize("mode", ("pd-cross", "pdd"))
def test_kv_scale_divides_the_wan_kv_and_keeps_the_tokens(scaled, reference, mode):
    prompt = [(13 * i + len(mode)) % 250 for i in range(160)]
    gen = generate(scaled.channel, prompt, 8, mode=mode, request_id=f"s-{mode}")
    assert [t.token for t in gen.tokens] == reference(prompt, 8)
    ends = [e for e in scaled.events("p1") if e.request_id == f"s-{mode}" and e.event == "kv_send_end"]
    wan = [e for e in ends if e.fields.get("path") == "wan"]
    assert wan, [e.fields for e in ends]
    assert all(e.fields["kv_bytes"] % (70_272 // 4) == 0 for e in wan), [e.fields for e in wan]
    assert sum(e.fields["kv_bytes"] for e in wan) == len(prompt) * 70_272 // 4


def _data(**compute) -> dict:
    worker = {"grpc_port": 1, "accelerator": compute.pop("accelerator", "h800"), "devices": 16}
    return {
        "router": {"name": "router", "grpc_port": 2},
        "p": {**worker, "name": "p1", "grpc_port": 3},
        "rld": {**worker, "name": "rld1", "grpc_port": 4, "kv_port": 5},
        "md": {**worker, "name": "md1", "grpc_port": 6, "kv_port": 7, "capacity_tokens": compute.pop("md_cap", 4096)},
        "compute": {"mode": "modelled", **compute},
    }


@pytest.mark.parametrize(
    "data, needle",
    [
        (_data(arch="kimi-k2", accelerator="h900"), "p.accelerator"),
        (_data(), "compute.arch: required"),
        (_data(arch="gpt-9"), "compute"),
        (_data(arch="kimi-k2", md_cap=1 << 24), "md.capacity_tokens"),
    ],
)
def test_a_bad_modelled_deployment_is_one_error_naming_the_field(data, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        parse_config(data)


def test_a_real_deployment_refuses_modelled_fields():
    data = _data(arch="kimi-k2")
    data["compute"]["mode"] = "real"
    with pytest.raises(ConfigError, match="modelled only"):
        parse_config(data)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A modelled deployment that served one pdd request and stopped (its roles' last events written)."""
    run = started(tmp_path_factory, "modelled-stopped")
    d = next(run)
    generate(d.channel, [(17 * i + 5) % 250 for i in range(160)], 8, mode="pdd", request_id="pace")
    next(run, None)  # stops it
    return d


def test_each_modelled_role_records_its_pace_as_it_stops(finished):
    fields = {}
    for worker in ("p1", "rld1", "md1"):
        last = finished.events(worker)[-1]
        assert last.event == "role_cpu", worker
        f = fields[worker] = last.fields
        assert f["modelled_s"] >= 0 and f["modelled_late_s"] >= 0 and f["modelled_late_max_ms"] >= 0, (worker, f)
        assert f["modelled_late_max_ms"] <= 1000 * f["modelled_late_s"] + 1e-3, (worker, f)  # one pass within the sum
    # P prefilled; the RLD or the MD decoded (which of them, the handoff's timing decides)
    assert fields["p1"]["modelled_s"] > 0 and fields["rld1"]["modelled_s"] + fields["md1"]["modelled_s"] > 0
    router = finished.events("router")[-1]
    assert router.event == "role_cpu" and "modelled_s" not in router.fields  # the router models nothing


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """Decode steps of tens of ms: the default architecture modelled on this-machine (its fitted roofline)."""
    yield from started(tmp_path_factory, "modelled-slow", accelerator="this-machine", devices=1, arch="default")


def _beside_a_decoding_session(dep, mode: str, name: str, n: int = 4, sessions: int = 1, prompt: int = 40) -> float:
    """Requests name0.. (mode, 2 tokens each, prompt tokens long) while colocated sessions decode on the RLD, each at
    a different phase of their steps; the RLD's decode step then (s)."""
    cat = load_catalogue()
    step_s = Roofline(cat.accelerator("this-machine"), cat.model("default"), 1).decode_s([200])
    assert step_s > 0.02  # a step long enough to tell a wait of one step from none
    decoding = [
        threading.Thread(
            target=generate,
            args=(dep.channel, [(11 * i + k + len(name)) % 250 for i in range(60)], 120),
            kwargs={"mode": "colocated", "request_id": f"{name}-decoding{k}"},
        )
        for k in range(sessions)
    ]
    for t in decoding:
        t.start()
    try:
        for i in range(n):
            threading.Event().wait(0.3 + 0.05 * i)
            generate(
                dep.channel,
                [(13 * j + i + len(name)) % 250 for j in range(prompt)],
                2,
                mode=mode,
                request_id=f"{name}{i}",
            )
    finally:
        for t in decoding:
            t.join(60)
    return step_s


def test_a_prompt_opened_while_a_session_decodes_rides_the_next_step(slow):
    """An engine admits what it opened at its next step: a colocated prompt opened on the RLD (under the engine
    lock, between two of a session's steps) has its chunk in the step that follows, not one step later (the
    session's step, begun as the open released the lock, ran without it before the fix)."""
    step_s = _beside_a_decoding_session(slow, "colocated", "join")
    events = slow.events("rld1")
    for i in range(4):
        rid = f"join{i}"
        (opened,) = [e for e in events if e.event == "decode_open" and e.request_id == rid]
        first = next(e for e in events if e.event == "decode_step_mixed" and rid in e.fields["requests"])
        assert first.fields["decode_tokens"] >= 1, first.fields  # the session's step carried it
        waited = (first.t_ns - first.fields["duration_ns"] - opened.t_ns) / 1e9
        assert waited < step_s / 2, f"{rid}: its first chunk began {waited * 1e3:.1f} ms after its open"


def test_the_first_token_leaves_with_the_imported_kv(slow):
    """P's first token reaches the client through the RLD once the RLD holds the KV (pd-intra): sent as the import
    ends, not after the step of the sessions decoding there that the import's end let begin. Before the fix it was
    read back from the engine under its lock, and waited that step whenever the sessions had queued for the lock
    behind the import (6 of 43 requests of a modelled pd-intra run; some runs of this test, not all). Prompts of
    1,200 tokens: an import of some ms, long enough for them to queue."""
    step_s = _beside_a_decoding_session(slow, "pd-intra", "imported", sessions=3, prompt=1200)
    events = slow.events("rld1")
    for i in range(4):
        rid = f"imported{i}"
        (imported,) = [e for e in events if e.event == "kv_imported" and e.request_id == rid]
        first = next(e for e in events if e.event == "first_token" and e.request_id == rid)
        assert first.fields["index"] == 0
        waited = (first.t_ns - imported.t_ns) / 1e9
        assert waited < step_s / 2, f"{rid}: its first token left {waited * 1e3:.1f} ms after the import"
