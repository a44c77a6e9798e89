"""The simulated pipeline (experiments/sim): one request's times as the roofline and the line say, WAN bytes per
mode and hit, determinism, bad specs refused as for emulated runs, and `pddlab simulate`'s run directory."""

import json
from itertools import accumulate

import pytest

from experiments import cli
from experiments.analysis import summary as summary_mod
from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.pipeline import Simulation
from experiments.sim.simulate import simulate, workload_of
from experiments.sim.wan import CONTROL_FRAMES, load_calibration, slow_start
from experiments.sim.workers import Session
from experiments.spec.experiment import SpecError, load

SPEC = "pdd-bathtub-hetero"  # modelled compute: kimi-k2, P on 16 x h800, MD on 16 x h20


def line_profile(tmp_path, rate_mbit=1000, delay_ms=10, loss_pct=0.0, jitter_ms=0.0):
    path = tmp_path / "simline.yaml"
    path.write_text(
        f"name: simline\ndescription: a test line\nlink: {{rate_mbit: {rate_mbit}, delay_ms: {delay_ms}, "
        f"loss_pct: {loss_pct}, jitter_ms: {jitter_ms}}}\n"
    )
    return str(path)


def loaded(tmp_path, *sets, **line):
    return load_for_simulation(SPEC, [f"profile={line_profile(tmp_path, **line)}", *sets])


def measured(spec):
    """The requests simulated (the warm-up only seeds the P workers' prefix caches)."""
    return [r for r in workload_of(spec) if r.kind != "warmup"]


def one_request(tmp_path, variant, **line):
    return loaded(tmp_path, "workload.fixed_hit.requests=1", f"variants=[{variant}]", **line)


def test_one_request_cross_dc_ttft_is_prefill_plus_transfer_and_the_first_decode_step_follows(tmp_path):
    spec = one_request(tmp_path, "pd-cross")
    (rec,) = simulate(spec).records
    (req,) = measured(spec)
    cfg = sim_config(spec, "pd-cross")
    p, md = cfg.workers["p"][0].roofline, cfg.workers["md"][0].roofline
    prefill = p.prefill_s(req.prompt_len - req.cached_tokens, req.cached_tokens)
    kv = req.prompt_len * cfg.kv_bytes_per_token  # pd-cross: the whole prompt, no DRC
    ramp_s, ramp_bytes = slow_start(kv, 1e9, 0.02)
    line = 0.01 + ramp_s + (kv - ramp_bytes) * 8 / 1e9
    transfer = p.kv_transfer_s(req.prompt_len) + line + md.kv_transfer_s(req.prompt_len)
    back = 0.01  # the MD's tokens to the client, in site A: the line's one way
    assert rec.ttft_ms == pytest.approx((prefill + transfer + back) * 1e3)
    assert rec.ttft_decode_ms == pytest.approx((prefill + transfer + md.decode_s([req.prompt_len]) + back) * 1e3)
    assert rec.wan_kv_bytes == kv and rec.route == "p-md"
    assert rec.output_tokens == req.max_tokens and rec.md_tokens == req.max_tokens - 1


def test_pdds_copy_to_the_md_waits_for_its_drc_answer_a_round_trip_after_the_route(tmp_path):
    """P asks the MD's DRC where its copy starts as it starts its prefill; the MD answers once the router's open
    got there: on a 200 ms line the copy cannot start before 400 ms, however short the prefill."""
    direct = "deployment.policy.direct_max_transfer_ms=5000"  # P->MD on this line too
    spec = loaded(tmp_path, "workload.fixed_hit.requests=1", "variants=[pdd-hetero]", direct, delay_ms=200)
    (rec,) = simulate(spec).records
    (req,) = measured(spec)
    cfg = sim_config(spec, "pdd-hetero")
    p, md = cfg.workers["p"][0].roofline, cfg.workers["md"][0].roofline
    assert rec.route == "p-md" and p.prefill_s(req.prompt_len - req.cached_tokens, req.cached_tokens) < 0.4
    tokens = req.prompt_len - req.cached_tokens
    kv = tokens * cfg.kv_bytes_per_token
    ramp_s, ramp_bytes = slow_start(kv, 1e9, 0.4)
    line = 0.2 + ramp_s + (kv - ramp_bytes) * 8 / 1e9
    copy = p.kv_transfer_s(tokens) + line + md.kv_transfer_s(tokens)  # (slow start as one connection's: +-12 ms)
    # the answer, the copy, the token's way back; without the answer's wait it would start at the prefill's end
    assert (0.4 + copy + 0.2) * 1e3 <= rec.ttft_ms <= (0.4 + copy + 0.2) * 1e3 + 50


def test_a_busy_md_answers_its_drc_at_the_end_of_the_step_under_way(tmp_path):
    """The router's open reaches the MD a one-way after the route; the MD takes it between two steps (as it imports),
    then its answer crosses back: with a long decode under way there, pdd's copy starts at that step's end + the
    way back, not at an RTT."""
    direct = "deployment.policy.direct_max_transfer_ms=5000"  # P->MD on this line too
    one_md = "pools.md.workers=1"
    spec = loaded(tmp_path, "workload.fixed_hit.requests=1", "variants=[pdd-hetero]", direct, one_md, delay_ms=200)
    cfg, reqs = sim_config(spec, "pdd-hetero"), measured(spec)
    starts, t0 = {}, reqs[0].arrival_s
    for busy in (False, True):
        sim = Simulation(cfg, reqs)
        sent, md = sim.line.transfer, sim.md[0]  # (one MD: pools.md.workers=1)
        sim.line.transfer = lambda *a, _sent=sent, _env=sim.env, _busy=busy, **k: (
            starts.setdefault(_busy, _env.now) and _sent(*a, **k)
        )
        for _ in range(32 if busy else 0):  # a full batch of 60,000-token sessions decoding there from the start
            md.join(Session(sim.env, 10_000, 60_000))
        (rec,) = sim.run()
        assert rec.route == "p-md"
    steps = accumulate(md.model.roofline.decode_s([60_000 + k] * 32) for k in range(10_000))
    step_end = next(t for t in steps if t > t0 + 0.2)  # the step under way when the open arrives
    export = cfg.workers["p"][0].roofline.kv_transfer_s(reqs[0].prompt_len - reqs[0].cached_tokens)
    assert starts[False] == pytest.approx(t0 + 0.4 + export)
    assert starts[True] == pytest.approx(step_end + 0.2 + export) and step_end > t0 + 0.2 + 1e-4  # not at an end


def test_pd_intra_sends_nothing_on_the_wan_and_its_ttft_is_prefill_plus_the_fast_path(tmp_path):
    """The fast path: the copy streams over the LAN (the `lan` profile's 10 Gbit/s, TCP's payload share) from P's
    first step; what it has not carried by the prefill's end crosses then; the host links' export and import."""
    spec = one_request(tmp_path, "pd-intra-strong")
    (rec,) = simulate(spec).records
    (req,) = measured(spec)
    cfg = sim_config(spec, "pd-intra-strong")
    p, rld = cfg.workers["p"][0].roofline, cfg.workers["rld"][0].roofline
    prefill = p.prefill_s(req.prompt_len - req.cached_tokens, req.cached_tokens)
    goodput = 10e9 * 1448 / 1514
    left = req.prompt_len * cfg.kv_bytes_per_token - prefill * goodput / 8
    assert cfg.lan.rate_bps == pytest.approx(goodput) and left > 0  # kimi-k2's KV outlasts a short prefill
    lan = 0.02e-3 + left * 8 / goodput
    fast = p.kv_transfer_s(req.prompt_len) + rld.kv_transfer_s(req.prompt_len)
    assert rec.ttft_ms == pytest.approx((prefill + lan + fast) * 1e3)
    assert rec.wan_bytes == 0 and rec.route == "p-rld" and rec.rld_tokens == req.max_tokens - 1


def wan_kv(tmp_path, hit):
    spec = loaded(tmp_path, f"workload.fixed_hit.hit={hit}", "workload.fixed_hit.requests=8")
    s = simulate(spec).summary
    uncached = sum(r.prompt_len - r.cached_tokens for r in measured(spec))
    return {v: s.variants[v].wan_kv_bytes_total for v in s.variants} | {"uncached": uncached}


def test_pdd_wan_bytes_shrink_with_the_hit_and_pd_cross_ships_whole_prompts(tmp_path):
    low, high = wan_kv(tmp_path, 0.5), wan_kv(tmp_path, 0.9)
    assert low["pd-intra-strong"] == high["pd-intra-strong"] == 0
    assert high["pdd-hetero"] < low["pdd-hetero"] < low["pd-cross"]
    assert high["pd-cross"] == low["pd-cross"]  # the naive baseline sends every prompt whole
    bpt = 70_272  # kimi-k2's KV per token: pdd ships each prompt's uncached tokens only
    assert (low["pdd-hetero"], high["pdd-hetero"]) == (low["uncached"] * bpt, high["uncached"] * bpt)


def test_pdd_hands_over_to_the_md_and_the_rld_makes_few_tokens(tmp_path):
    s = simulate(loaded(tmp_path, "workload.fixed_hit.requests=8", "workload.fixed_hit.hit=0.5")).summary
    pdd = s.variants["pdd-hetero"]
    assert pdd.routes == {"p-rld-md": 8}
    assert pdd.handoff["count"] == 8
    assert 0 < pdd.rld_token_share < 0.5  # eager tokens while the KV crosses (~0.25 s here), then the MD's
    # the IDs (~1.3 KB): one one-way delay, and their ~10 us on the 1 Gbit/s line
    assert pdd.handoff["ready_ms"]["p50"] == pytest.approx(10.0, abs=0.02)
    assert pdd.wan_handoff_bytes_total == sum(15 * n for n in [pdd.handoff["tokens"]["mean"]] * 8)


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path):
    spec = loaded(tmp_path, "workload.fixed_hit.requests=6", jitter_ms=3.0)
    a, b, c = (simulate(spec, seed=s, analyse=False).records for s in (1, 1, 2))
    assert [r.token_ms for r in a] == [r.token_ms for r in b]
    assert [r.token_ms for r in a] != [r.token_ms for r in c]


def test_what_the_simulator_leaves_out_is_said_in_the_summary(tmp_path):
    spec = loaded(tmp_path, "workload.fixed_hit.requests=2", "handoff=chunked", "variants=[pdd-hetero]")
    s = simulate(spec).summary
    said = [w["message"] for w in s.warnings]
    # a 1 Gbit/s line at 20 ms, no loss: no line the calibration measured is near it
    assert said[0].startswith("Simulated, not measured") and "no point near this line" in said[0]
    assert said[1:] == ["Simulated as one-shot: the chunked handoff."]
    assert s.variants["pdd-hetero"].handoff["modes"] == {"chunked (as oneshot)": 2}


@pytest.mark.parametrize(
    "sets",
    [
        ["variants=[nope]"],
        ["deployment.compute.arch=gpt-9"],
        ["pools.md.workers=0"],
        ["workload.fixed_hit.hit=1.5"],
        ["deployment.policy.no_such_knob=1"],
    ],
)
def test_a_bad_spec_is_refused_with_the_emulated_runs_message(sets):
    with pytest.raises(SpecError) as emulated:
        load(SPEC, sets)
    with pytest.raises(SpecError) as simulated:
        load_for_simulation(SPEC, sets)
    assert str(simulated.value) == str(emulated.value)


def test_a_deployment_larger_than_this_machine_is_simulated(tmp_path):
    sets = ["pools.p.workers=16", "pools.rld.workers=2", "pools.md.workers=14"]
    with pytest.raises(SpecError, match="more than this machine"):
        load(SPEC, sets)
    cfg = sim_config(load_for_simulation(SPEC, sets), "pdd-hetero")
    assert cfg.accelerators == (16 + 1 + 14) * 16  # pdd-hetero runs one RLD of the two


def test_pddlab_simulate_writes_a_summary_marked_simulated(tmp_path, capsys):
    out = tmp_path / "run"
    status = cli.main(["simulate", SPEC, "--set", f"profile={line_profile(tmp_path)}", "--requests", "5",
                       "--out", str(out)])  # fmt: skip
    assert status == 0
    s = summary_mod.read(out)  # the emulated run's schema: compare and the reports read it
    assert s.simulated is True and s.analysed_by["simulated"] is True
    assert set(s.variants) == {"pd-intra-strong", "pd-cross", "pdd-hetero"}
    assert all(v.completed == 5 for v in s.variants.values())
    assert s.variants["pdd-hetero"].ttft_ms.ci95 is not None and s.cost.variants["pdd-hetero"].bcr is not None
    assert "SIMULATED" in (out / "summary.md").read_text()
    assert json.loads((out / "simulation.json").read_text())["simulated"] is True
    assert cli.main(["compare", str(out), str(out)]) == 0  # requests.jsonl: runs pair request by request
    assert cli.main(["simulate", SPEC, "--set", "variants=[nope]", "--out", str(tmp_path / "bad")]) == cli.BAD_INPUT
    assert "variants=['nope']" in capsys.readouterr().err


def test_a_modelled_spec_is_judged_against_its_architectures_context_as_pddlab_run_judges_it():
    # pdd-published's Mooncake slice has prompts past the small model's 4,096 tokens; kimi-k2 holds 131,072
    loaded = load_for_simulation("pdd-published")
    assert loaded.spec.workload.synthetic.max_context_tokens > 4096


def two_turns(tmp_path, kv_wait_ms: int):
    """One session of two turns on a 5 Mbit/s line: turn 0's WAN copy (~500 tokens of kimi-k2, ~56 s) is still
    under way when turn 1 comes (after a 16-token reply on the RLD and a ~0 s think)."""
    synthetic = (
        "workload.synthetic={sessions: 1, turns: [2, 2], system_prompt_tokens: 32, first_turn_tokens: [480, 480],"
        " turn_tokens: [40, 40], big_turn_fraction: 0, output_tokens: [16, 16], think_s_mean: 0.001,"
        " fresh_requests: 0, singular_fraction: 0}"
    )
    sets = [
        "variants=[pdd-hetero]",
        "workload.source=synthetic",
        synthetic,
        f"deployment.decode.kv_wait_ms={kv_wait_ms}",
    ]
    spec = loaded(tmp_path, *sets, rate_mbit=5)
    sim = Simulation(sim_config(spec, "pdd-hetero"), workload_of(spec), spec.spec.workload.seed, load_calibration())
    first, second = sorted(sim.run(), key=lambda r: r.turn)
    return first, second, sim.line.bytes_sent


def test_a_turn_whose_prefix_is_still_crossing_ships_only_what_lies_beyond(tmp_path):
    # decode.py's in-flight DRC: turn 1 waits for turn 0's copy instead of shipping its whole prompt again
    first, second, shipped = two_turns(tmp_path, kv_wait_ms=180_000)
    assert first.fallbacks == ["completed_on_rld:md_never_ready"]
    kv = 70_272  # kimi-k2's KV bytes a token
    # turn 0's prompt and reply in whole blocks of 16 (its last token has no KV): 32 + 480 + 15 -> 512
    assert second.inflight_tokens == 512 - 32 and second.md_cached_tokens == 512
    # turn 0: all but the system prompt; turn 1: its new tokens alone
    assert shipped == (first.prompt_tokens - 32) * kv + (second.prompt_tokens - 512) * kv
    # both answered from the RLD within ~1.4 s, the copies land at ~14 and ~62 s: past the variant's end (cut_at_end)
    assert first.wan_kv_bytes == second.wan_kv_bytes == 0 and not first.relay_absorbed
    assert second.ok and "prefix_lost" not in second.fallbacks


def test_a_turn_waiting_on_a_copy_that_never_lands_loses_its_prefix_and_finishes_on_the_rld(tmp_path):
    first, second, _shipped = two_turns(tmp_path, kv_wait_ms=30_000)  # turn 0's copy (~56 s) misses its 30 s
    assert first.fallbacks == ["completed_on_rld:md_never_ready"] and not first.relay_absorbed
    assert second.inflight_tokens > 0 and second.ok
    # the RLD answered before the MD found the prefix gone (30 s after turn 0 began): both causes, in that order
    assert second.fallbacks == ["completed_on_rld:md_never_ready", "prefix_lost"] and second.md_tokens == 0


def test_a_messages_crossing_and_the_tokens_way_back_take_their_frames_largest_jitter(tmp_path):
    """pd-cross, one request, a 10 ms line with 4 ms of (uniform) jitter against none: the KV copy's thousands of
    frames take ~+4 ms (their largest draw), the MD's token back to the client the mean of 3 frames' (+2 ms)."""
    base = simulate(one_request(tmp_path, "pd-cross")).records[0]
    spec = one_request(tmp_path, "pd-cross", jitter_ms=4.0)
    (rec,) = simulate(spec).records
    back = Simulation(sim_config(spec, "pd-cross"), []).back_s
    assert back == pytest.approx(0.01 + 0.004 * (CONTROL_FRAMES - 1) / (CONTROL_FRAMES + 1))
    assert rec.ttft_ms - base.ttft_ms == pytest.approx(4.0 + 2.0, abs=0.1)


def test_a_copy_still_crossing_when_the_last_request_ends_counts_no_wan_bytes_as_in_an_emulated_run(tmp_path):
    """pdd, one request, P->RLD->MD: on a 1 Mbit/s line its MD gives up (kv_wait_ms) and the RLD decodes to the end
    long before the copy is in; the emulated variant stops there, its P never logs the copy's end (kv_send_end), so
    the request carries no WAN KV bytes. On a 1 Gbit/s line the copy ends within the request: counted."""
    rld_md = "deployment.policy.direct_max_transfer_ms=0"  # never P->MD
    slow = simulate(loaded(tmp_path, "workload.fixed_hit.requests=1", "variants=[pdd-hetero]", rld_md, rate_mbit=1))
    (rec,) = slow.records
    assert rec.route == "p-rld-md" and rec.ok and rec.md_tokens == 0
    assert rec.wan_kv_bytes == 0 and rec.wan_bytes == rec.wan_handoff_bytes
    (fast,) = simulate(loaded(tmp_path, "workload.fixed_hit.requests=1", "variants=[pdd-hetero]", rld_md)).records
    assert fast.route == "p-rld-md" and fast.md_tokens > 0 and fast.wan_kv_bytes > 0
