"""A real-compute spec as the simulator runs it: step and KV-import times as the emulated runs of pdd-vs-baselines
measured them on this machine (experiments/sim/realcompute.py), and the load generator's issue deadline."""

import pytest

from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.pipeline import Simulation
from experiments.sim import realcompute
from experiments.sim.realcompute import P_STEP_FIXED_S, Contention, MeasuredRoofline
from experiments.sim.simulate import simulate, workload_of
from workers.model import get_config
from workers.modelled.roofline import Part, Roofline

SPEC = "pdd-vs-baselines"  # real compute: the default model on this machine's CPU
# The profile matrices realcompute's levels were fitted on (P: p-level; the decode worker: decode-level): 29 runs.
# Later matrices are kept beside them in docs/runs and are not in the fit (a night's machine runs every step up to
# 2x faster or slower than another's: docs/simulator.md "Where the validation stands").
FITTED_ON = ("profile-matrix", "profile-matrix-20261205", "profile-matrix-20261205-topologies",
             "profile-matrix-20261206", "profile-matrix-20261206b")  # fmt: skip


def fitted_summaries():
    """summary.json of every run of the matrices the levels were fitted on."""
    from pathlib import Path

    runs = Path(__file__).resolve().parents[2] / "docs" / "runs"
    return sorted(f for m in FITTED_ON for f in (runs / m).glob("**/summary.json"))


PROFILE = "profile=wan-regional"


def real(*sets):
    return load_for_simulation(SPEC, [PROFILE, *sets])


def chunked_prefill_s(roofline, new: int, cached: int, budget: int = 256) -> float:
    """A prompt alone on P: its chunks of prefill.step_budget_tokens, a step each (logits at the last)."""
    seconds = 0.0
    while new:
        n = min(budget, new)
        seconds += roofline.step([Part(n, cached, 1 if n == new else 0)]).seconds
        new, cached = new - n, cached + n
    return seconds


def test_a_real_compute_prefill_takes_what_the_emulated_runs_measured():
    # events p1 prefill_done of results/20261204-195628 and -200730: 97 new tokens on 512 cached took 263 ms
    # (pd-intra, the least contended) to 1,476 ms (pd-cross); the lone engine's roofline says 187 ms
    p = sim_config(real(), "pd-intra").workers["p"][0].roofline
    assert 0.263 <= p.prefill_s(97, 512) <= 1.476
    # a 623-token prompt is three 256-token engine steps: 1.4 s (pd-intra) to 4.3 s (pd-cross) measured
    assert 1.4 <= p.prefill_s(623, 512) <= 4.3


def test_two_prompts_sharing_a_step_pay_its_fixed_cost_once():
    """One prompt's 44-token tail and the next one's 212-token first chunk fill one 256-token step: one fixed
    cost (it was fitted per engine step), not one per prompt in the step."""
    p = sim_config(real(), "pd-intra").workers["p"][0].roofline
    shared = p.step([Part(44, 768, 1), Part(212, 512, 0)]).seconds
    apart = p.step([Part(44, 768, 1)]).seconds + p.step([Part(212, 512, 0)]).seconds
    assert shared < apart - 0.5 * P_STEP_FIXED_S


def test_the_simulated_decode_worker_runs_at_the_profile_matrix_runs_median_tpot():
    """The decode worker's level (realcompute's MIXED_STEP_*, DECODE_FACTOR; docs/simulator.md "The decode worker's
    constants"): the simulated TPOT p50 of colocated and pd-intra (no WAN: the same on every profile) within 15% of
    the median of the emulated runs' TPOT p50 kept in docs/runs (18-72 ms each, median ~39; the constants before,
    fitted on three slow runs, gave 2.5x that)."""
    import json
    import statistics

    tpot = []
    for f in fitted_summaries():
        for v in ("colocated", "pd-intra"):
            tpot.append(json.loads(f.read_text())["variants"][v]["tpot_ms"]["p50"])
    assert len(tpot) >= 58
    loaded = real()
    reqs = workload_of(loaded)
    for v in ("colocated", "pd-intra"):
        recs = Simulation(sim_config(loaded, v), reqs, loaded.spec.workload.seed).run()
        simulated = statistics.median(r.tpot_ms for r in recs if r.ok and r.tpot_ms is not None)
        assert simulated == pytest.approx(statistics.median(tpot), rel=0.15)


def test_the_fast_path_costs_the_measured_kv_import_and_the_wire_carries_the_engines_kv_per_token():
    spec = real("variants=[pd-intra]")
    cfg = sim_config(spec, "pd-intra")
    assert cfg.kv_bytes_per_token == get_config("default").kv_bytes_per_token == 49152
    reqs = workload_of(spec)
    req = next(r for r in reqs if r.kind != "warmup" and not r.after)  # alone on the pipeline
    (rec,) = Simulation(cfg, [r for r in reqs if r.kind == "warmup"] + [req]).run()  # P holds the warm-up's prompt
    prefill = chunked_prefill_s(cfg.workers["p"][0].roofline, req.prompt_len - req.cached_tokens, req.cached_tokens)
    # events rld1 kv_recv_end -> kv_imported: 61 ms (pd-intra) to 158 ms (pd-cross's MD) for whole prompts
    assert 0.045 <= rec.ttft_ms / 1e3 - prefill <= 0.16
    assert rec.fast_kv_bytes == req.prompt_len * 49152


def test_nothing_is_sent_past_the_issue_deadline_and_a_late_turn_takes_the_rest_of_its_session_with_it():
    spec = real("timeouts.issue_s=20", "variants=[pd-cross]", "profile=wan-congested")
    run = simulate(spec)
    late = [r for r in run.records if not r.issued]
    sent = [r for r in run.records if r.issued]
    assert late and sent
    assert all(r.t_send_ns <= 20e9 for r in sent)
    assert all(not r.ok and r.output_tokens == 0 and "issue deadline" in r.error for r in late)
    by_session = {}
    for r in run.records:
        by_session.setdefault(r.session, []).append(r)
    for turns in by_session.values():  # once a turn is unsent, every later turn of its session is too
        flags = [r.issued for r in sorted(turns, key=lambda r: r.turn)]
        assert flags == sorted(flags, reverse=True)


@pytest.mark.parametrize("variant", ["colocated", "pd-intra", "pd-cross", "pdd"])
def test_without_an_issue_deadline_every_request_is_sent(variant):
    run = simulate(real("timeouts.issue_s=0", f"variants=[{variant}]"))
    assert all(r.issued and r.ok for r in run.records)


# the count each variant's mode gives (one worker a pool): its pools' engines, its P as a WAN sender if it crosses
COUNTS = {"colocated": (1, 0), "pd-intra": (2, 0), "pd-cross": (2, 1), "pdd": (3, 1)}


@pytest.mark.parametrize(("variant", "counts"), COUNTS.items())
def test_a_variants_contention_is_its_pools_engines_and_its_wan_senders(variant, counts):
    for pool in sim_config(real(), variant).workers.values():
        assert pool[0].roofline.contention == Contention(*counts)


def test_more_workers_in_a_pool_are_more_engines_and_more_p_workers_more_wan_senders():
    cfg = sim_config(real("pools.p.workers=2", "pools.md.workers=2"), "pdd")
    assert cfg.workers["rld"][0].roofline.contention == Contention(engines=5, wan_senders=2)
    assert sim_config(real("pools.p.workers=2"), "pd-intra").workers["p"][1].roofline.contention == Contention(3, 0)


def test_the_slowdown_is_one_plus_each_other_engines_and_wan_senders_share_over_the_pooled_one():
    k = (1 + 2 * realcompute.ENGINE_SLOWDOWN + realcompute.WAN_SENDER_SLOWDOWN) / realcompute.POOLED_SLOWDOWN
    assert Contention(3, 1).slowdown == pytest.approx(k)
    assert Contention(1, 0).slowdown == pytest.approx(1 / realcompute.POOLED_SLOWDOWN)


@pytest.mark.parametrize("variant", COUNTS)
def test_every_time_of_a_worker_scales_with_its_variants_slowdown(variant):
    """P's steps, the RLD's and MD's decode and mixed steps and their imports: each x the variant's slowdown, against
    the same worker with one engine alone on the machine."""
    for role, pool in sim_config(real(), variant).workers.items():
        r = pool[0].roofline
        alone = MeasuredRoofline(r.accelerator, r.model, prefill_worker=role == "p", chunk_tokens=r.chunk_tokens)
        k = Contention(*COUNTS[variant]).slowdown / Contention(1, 0).slowdown
        k *= realcompute.DECODE_WAN_SLOWDOWN if role != "p" and COUNTS[variant][1] else 1.0
        for parts in ([Part(100, 600, 1)], [Part(1, 700, 1)] * 3, [Part(1, 700, 1), Part(20, 680, 1)]):
            assert r.step(parts).seconds == pytest.approx(k * alone.step(parts).seconds, rel=1e-12)
        assert r.decode_s([700, 650]) == pytest.approx(k * alone.decode_s([700, 650]), rel=1e-12)
        assert r.kv_import_s(600) == pytest.approx(k * alone.kv_import_s(600), rel=1e-12)


@pytest.mark.parametrize("variant", COUNTS)
def test_a_decode_worker_is_slowed_by_decode_wan_slowdown_where_its_variant_sends_kv_over_the_wan(variant, monkeypatch):
    """DECODE_WAN_SLOWDOWN: the RLD's and MD's steps and imports in pd-cross and pdd (their P sends KV over the WAN),
    never P's, never colocated's or pd-intra's decode workers."""
    before = {role: pool[0].roofline for role, pool in sim_config(real(), variant).workers.items()}
    monkeypatch.setattr(realcompute, "DECODE_WAN_SLOWDOWN", 2.0 * realcompute.DECODE_WAN_SLOWDOWN)
    for role, pool in sim_config(real(), variant).workers.items():
        r, k = pool[0].roofline, 2.0 if role != "p" and COUNTS[variant][1] else 1.0
        for parts in ([Part(100, 600, 1)], [Part(1, 700, 1)] * 3, [Part(1, 700, 1), Part(20, 680, 1)]):
            assert r.step(parts).seconds == pytest.approx(k * before[role].step(parts).seconds, rel=1e-12)
        assert r.kv_import_s(600) == pytest.approx(k * before[role].kv_import_s(600), rel=1e-12)


def test_modelled_compute_has_no_slowdown_it_is_the_catalogues_roofline():
    spec = load_for_simulation("experiments/specs/sim/pdd-published-scale.yaml")
    for variant in spec.spec.variants:
        for pool in sim_config(spec, variant).workers.values():
            assert all(type(w.roofline) is Roofline for w in pool)


def test_the_simulated_p_is_busy_as_long_as_the_profile_matrix_runs_p_at_their_median():
    """The P step's level (realcompute.P_STEP_*, docs/simulator.md "P's step time"): the simulated P's busy time in
    pd-intra and pdd within 15% of the median of the emulated P's over the 23 runs kept in docs/runs (9-34 s each;
    the constants before, 0.203 s + 2.29x, gave 23.9 s against their 15.2 s)."""
    import json
    import statistics

    busy = []
    for f in fitted_summaries():
        for v in ("pd-intra", "pdd"):
            d = json.loads(f.read_text())["variants"][v]
            busy.append(d["workers"]["p1"]["busy_pct"] * d["duration_s"] / 100)
    assert len(busy) >= 46
    loaded = real()
    reqs = workload_of(loaded)
    for v in ("pd-intra", "pdd"):
        sim = Simulation(sim_config(loaded, v), reqs, loaded.spec.workload.seed)
        sim.run()
        assert sum(p.busy_s for p in sim.p) == pytest.approx(statistics.median(busy), rel=0.15)
