"""The simulator's limits (experiments/sim): KV capacity (refusal, the admission queue, the MD's DRC evicted when its
memory is small), timeouts.request_s and decode.kv_wait_ms as the emulated client and roles apply them, and a
burst-loss profile's stationary mean loss on the line."""

import pytest
import yaml

from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.simulate import simulate
from experiments.sim.wan import line_from_profile
from topology.profiles import load_profile
from workers.modelled.catalogue import ACCELERATORS_FILE, load_catalogue

SPEC = "pdd-bathtub-hetero"  # modelled: kimi-k2 (70,272 B of KV a token), P and RLD on 16 x h800, MD on 16 x h20
BLOCK = 16


def line(tmp_path, rate_mbit=1000, delay_ms=10, extra=""):
    path = tmp_path / "simline.yaml"
    path.write_text(
        f"name: simline\ndescription: a test line\nlink: {{rate_mbit: {rate_mbit}, delay_ms: {delay_ms}{extra}}}\n"
    )
    return str(path)


def small_md(tmp_path, kv_tokens: int) -> list[str]:
    """Overrides that put the MDs on 16 devices whose memory holds kimi-k2's weights and kv_tokens of KV."""
    shipped = yaml.safe_load(ACCELERATORS_FILE.read_text())["accelerators"]
    h20 = next(a for a in shipped if a["name"] == "h20")
    weights = load_catalogue().model("kimi-k2").weights_bytes
    memory = (weights + (kv_tokens + 0.5) * 70_272) / (16 * 0.9)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"accelerators": [h20 | {"name": "small-h20", "memory_bytes": memory}]}))
    return [
        f"deployment.compute.catalogue={path}",
        "deployment.md.accelerator=small-h20",
        f"capacity_tokens.md={BLOCK}",  # the emulated engine's slots must fit; the simulator sizes by memory
    ]


def records(spec, variant):
    return [r for r in simulate(spec, analyse=False).records if r.variant == variant]


def fixed(tmp_path, *sets, **kw):
    return load_for_simulation(SPEC, [f"profile={line(tmp_path, **kw)}", *sets])


def test_the_md_sizes_its_kv_by_its_devices_memory(tmp_path):
    spec = fixed(tmp_path, *small_md(tmp_path, 800))
    from experiments.sim.kvroom import kv_capacity_tokens

    assert kv_capacity_tokens(sim_config(spec, "pd-cross").workers["md"][0]) == 800


def test_a_request_that_can_never_fit_is_refused_as_the_engine_refuses_it(tmp_path):
    # prompt 384 + 256..384 output tokens: 40-48 blocks; the MD holds 31
    spec = fixed(tmp_path, "variants=[pd-cross]", "workload.fixed_hit.requests=3", *small_md(tmp_path, 500))
    recs = records(spec, "pd-cross")
    assert [r.ok for r in recs] == [False] * 3
    for r in recs:
        assert r.error.startswith(f"RESOURCE_EXHAUSTED: request {r.request_id}: every worker stream ended after 0")
        assert "md: md" in r.error and "(larger than the whole cache)" in r.error
        assert r.output_tokens == 0 and r.wan_bytes == 0


def test_a_request_without_room_waits_for_the_one_before_it(tmp_path):
    # hit 0.5: each request holds 28-36 blocks of an MD's 50 beside the shared head: one at a time
    sets = ["variants=[pd-cross]", "workload.fixed_hit.requests=2", "workload.fixed_hit.rate_per_s=100",
            "workload.fixed_hit.hit=0.5", "pools.md.workers=1"]  # fmt: skip
    small = records(fixed(tmp_path, *sets, *small_md(tmp_path, 800)), "pd-cross")
    first, second = sorted(small, key=lambda r: r.t_send_ns)
    assert first.ok and second.ok
    second_first_token_ns = second.t_send_ns + second.ttft_ms * 1e6
    assert second_first_token_ns >= first.t_done_ns  # its KV could land only once the first left the MD
    roomy = records(fixed(tmp_path, *sets), "pd-cross")
    assert max(r.ttft_ms for r in roomy) < second.ttft_ms


def test_a_small_mds_drc_forgets_sessions_and_its_hit_falls(tmp_path):
    sets = ["variants=[pdd-hetero]", "workload.source=synthetic",
            "workload.synthetic={sessions: 12, session_rate_per_s: 50, turns: [4, 4], system_prompt_tokens: 32,"
            " first_turn_tokens: [200, 300], output_tokens: [200, 300], think_s_mean: 0.5, fresh_requests: 0,"
            " singular_fraction: 0}"]  # fmt: skip

    def later_turns(*more):
        recs = records(fixed(tmp_path, *sets, *more), "pdd-hetero")
        assert all(r.ok for r in recs)
        later = [r for r in recs if r.turn > 0 and r.drc_hit is not None]  # None: fell back to P -> RLD
        return sum(r.drc_hit for r in later) / len(later), sum(r.expected_hit for r in later) / len(later)

    (roomy, expected), (small, _) = later_turns(), later_turns(*small_md(tmp_path, 1200))
    assert roomy == pytest.approx(expected)  # every later turn finds its session's previous one
    assert small < roomy / 2  # evicted (least recently used) while other sessions needed the room


def test_a_request_past_timeouts_request_s_fails_as_the_clients_deadline_fails_it(tmp_path):
    # pd-cross ships 27 MB whole over 5 Mbit/s (~43 s); the client gives up after 2 s
    spec = fixed(tmp_path, "variants=[pd-cross]", "workload.fixed_hit.requests=2", "timeouts.request_s=2",
                 rate_mbit=5)  # fmt: skip
    run = simulate(spec)
    recs = [r for r in run.records if r.variant == "pd-cross"]
    assert [r.error for r in recs] == ["DEADLINE_EXCEEDED: Deadline Exceeded"] * 2
    assert all(r.t_done_ns - r.t_send_ns == pytest.approx(2e9) and r.e2e_ms is None for r in recs)
    v = run.summary.variants["pd-cross"]
    assert (v.completed, v.failed) == (0, 2)


def test_an_md_past_kv_wait_gives_up_pdd_finishes_on_the_rld_and_pd_cross_fails(tmp_path):
    # 2,000 output tokens keep the RLD decoding ~6 s; the MD's KV (~4 s over 5 Mbit/s) misses kv_wait_ms = 2 s
    sets = ["variants=[pd-cross, pdd-hetero]", "workload.fixed_hit.requests=2", "deployment.decode.kv_wait_ms=2000",
            "workload.fixed_hit.output_tokens=[2000, 2000]"]  # fmt: skip
    recs = simulate(fixed(tmp_path, *sets, rate_mbit=5), analyse=False).records
    pdd = [r for r in recs if r.variant == "pdd-hetero"]
    assert all(r.ok and r.route == "p-rld-md" for r in pdd)
    assert all(r.md_tokens == 0 and r.rld_tokens == 1999 and r.handoff is None for r in pdd)
    assert all(r.fallbacks == ["completed_on_rld:md_never_ready"] and not r.relay_absorbed for r in pdd)
    cross = [r for r in recs if r.variant == "pd-cross"]
    assert all(not r.ok and r.output_tokens == 0 for r in cross)
    assert all(
        r.error.endswith("every worker stream ended after 0 of 2000 tokens (md ended: kv_timeout)") for r in cross
    )
    assert all(r.t_done_ns - r.t_send_ns == pytest.approx(2e9) for r in cross)  # at the deadline, not the landing


@pytest.mark.parametrize(
    "loss",
    [", loss_ge: {p_pct: 1, r_pct: 24, bad_loss_pct: 50}", ", loss_state: {p13_pct: 2, p31_pct: 30, p23_pct: 1}"],
)
def test_a_burst_loss_model_caps_tcp_by_its_stationary_mean(tmp_path, loss):
    profile = load_profile(line(tmp_path, extra=loss))
    mean_pct = profile.a_to_b.expected_loss_pct
    assert mean_pct > 0
    assert line_from_profile(profile).loss == pytest.approx(mean_pct / 100)
    spec = fixed(tmp_path, "workload.fixed_hit.requests=1", "variants=[pd-cross]", extra=loss)
    said = [w["message"] for w in simulate(spec).summary.warnings]
    assert any("bursts" in m and f"{mean_pct:.3g}%" in m for m in said)
    assert not any("Not simulated: Gilbert-Elliott loss" in m for m in said)


def test_pdds_direct_route_falls_back_to_the_rld_when_the_md_refuses(tmp_path):
    # hit 0.98: 8 uncached tokens, so the router sends P->MD; the MD (31 blocks) can never hold 40-48
    sets = ["variants=[pdd-hetero]", "workload.fixed_hit.requests=2", "workload.fixed_hit.hit=0.98"]
    assert all(r.route == "p-md" for r in records(fixed(tmp_path, *sets), "pdd-hetero"))
    recs = records(fixed(tmp_path, *sets, *small_md(tmp_path, 500)), "pdd-hetero")
    assert all(r.ok and r.route == "p-rld-fallback" and r.fallbacks == ["route_fallback:md"] for r in recs)
    assert all(r.rld_tokens == r.max_tokens - 1 and r.md_tokens == 0 and r.wan_bytes == 0 for r in recs)


def test_a_request_past_its_deadline_keeps_the_tokens_made_before_it(tmp_path):
    sets = [
        "variants=[pd-intra-strong]",
        "workload.fixed_hit.requests=1",
        "workload.fixed_hit.output_tokens=[1000, 1000]",
    ]
    (full,) = records(fixed(tmp_path, *sets), "pd-intra-strong")
    (cut,) = records(fixed(tmp_path, *sets, "timeouts.request_s=1"), "pd-intra-strong")
    assert full.ok and full.e2e_ms > 2000
    assert not cut.ok and cut.error == "DEADLINE_EXCEEDED: Deadline Exceeded"
    before = [t for t in full.token_ms if t <= 1000]
    assert cut.token_ms == pytest.approx(before) and cut.output_tokens == len(before) > 100


def test_a_rate_trace_runs_at_its_mean_rate_and_is_said_not_simulated():
    """wan-cellular-trace has no rate_mbit: the simulator ran it as an unlimited line (pd-cross TTFT p50 511 ms
    against the emulator's 52,984 ms) and said nothing."""
    from topology.rate_trace import load_trace

    profile = load_profile("wan-cellular-trace")
    mean = load_trace(profile.a_to_b.rate_trace).mean_rate_mbit()
    assert 0 < mean < 1000
    assert line_from_profile(profile).rate_bps == pytest.approx(mean * 1e6)
    spec = load_for_simulation(
        SPEC, ["profile=wan-cellular-trace", "workload.fixed_hit.requests=1", "variants=[pd-cross]"]
    )
    said = [w["message"] for w in simulate(spec).summary.warnings]
    assert any("rate trace" in m and f"{mean:.3g} Mbit/s" in m for m in said), said
