"""The simulated LAN (the fast path P -> RLD): the spec's lan_profile, the copy streamed during P's prefill, P's
link shared by its copies, an unlimited LAN; and the field as the emulated run takes it."""

from pathlib import Path

import pytest

from experiments.run.runner import topology_config
from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.simulate import simulate, workload_of
from experiments.spec.experiment import SpecError, load

SPEC = "pdd-bathtub-hetero"  # modelled compute: kimi-k2 (70,272 B of KV a token), P on 16 x h800


def lan(tmp_path, rate_mbit):
    path = tmp_path / f"lan{rate_mbit}.yaml"
    link = f"link: {{rate_mbit: {rate_mbit}, delay_ms: 0.02}}"
    path.write_text(f"name: lan{rate_mbit}\ndescription: a test LAN\n{link}\n")
    return str(path)


def pd_intra(tmp_path, rate_mbit, *sets, requests=1):
    spec = load_for_simulation(
        SPEC,
        [
            f"lan_profile={lan(tmp_path, rate_mbit)}",
            f"workload.fixed_hit.requests={requests}",
            "variants=[pd-intra-strong]",
            *sets,
        ],
    )
    reqs = [r for r in workload_of(spec) if r.kind != "warmup"]
    return spec, reqs, simulate(spec).records


def times(spec, req):
    cfg = sim_config(spec, "pd-intra-strong")
    p, rld = cfg.workers["p"][0].roofline, cfg.workers["rld"][0].roofline
    prefill = p.prefill_s(req.prompt_len - req.cached_tokens, req.cached_tokens)
    host = p.kv_transfer_s(req.prompt_len) + rld.kv_transfer_s(req.prompt_len)
    return prefill, host, req.prompt_len * cfg.kv_bytes_per_token


def test_a_slow_lan_holds_the_first_token_until_the_copy_crossed_it(tmp_path):
    spec, (req,), (rec,) = pd_intra(tmp_path, 100)
    prefill, host, kv = times(spec, req)
    goodput = 100e6 * 1448 / 1514
    assert kv * 8 / goodput > 2 * prefill  # the LAN, not the prefill, bounds this copy
    # streamed from P's first step: the whole copy at the LAN's goodput, not after the prefill
    assert rec.ttft_ms == pytest.approx((0.02e-3 + kv * 8 / goodput + host) * 1e3)


@pytest.mark.parametrize("rate_mbit", [100_000, 0])  # a LAN that keeps up with the prefill; unlimited
def test_a_lan_faster_than_the_prefill_hides_the_copy(tmp_path, rate_mbit):
    spec, (req,), (rec,) = pd_intra(tmp_path, rate_mbit)
    prefill, host, kv = times(spec, req)
    assert rec.ttft_ms == pytest.approx((prefill + 0.02e-3 + host) * 1e3)  # the LAN's one-way delay


def test_copies_that_outlast_their_prefills_share_ps_link(tmp_path):
    """Eight prompts sent within a few ms through one P (of the spec's two) on a 100 Mbit/s LAN: each copy takes
    ~10x its prefill, so they overlap on P's link, and the last first token comes once all their bytes crossed at
    the LAN's goodput (each copy on a link of its own: one copy's time after the last prefill)."""
    spec, reqs, recs = pd_intra(tmp_path, 100, "workload.fixed_hit.rate_per_s=1000", "pools.p.workers=1", requests=8)
    goodput = 100e6 * 1448 / 1514
    kv = [times(spec, r)[2] for r in reqs]
    first = min(rec.t_send_ns for rec in recs) / 1e6
    last = max(rec.t_send_ns / 1e6 + rec.ttft_ms for rec in recs)
    assert max(rec.t_send_ns for rec in recs) / 1e6 - first < max(kv) * 8 / goodput * 1e3 / 4  # sent together
    assert last - first >= sum(kv) * 8 / goodput * 1e3 * 0.99


def test_a_lan_profile_that_does_not_load_is_refused_naming_the_field():
    with pytest.raises(SpecError, match=": lan_profile: ") as emulated:
        load(SPEC, ["lan_profile=no-such-lan"])
    with pytest.raises(SpecError) as simulated:
        load_for_simulation(SPEC, ["lan_profile=no-such-lan"])
    assert str(simulated.value) == str(emulated.value)


def test_the_emulated_run_builds_its_lan_from_the_spec(tmp_path):
    path = lan(tmp_path, 2460)
    loaded = load("pdd-smoke", [f"lan_profile={path}"])
    cfg = topology_config(loaded.spec, loaded.profile, Path(tmp_path), play_schedule=False)
    assert (cfg.lan_profile.name, cfg.lan_profile.a_to_b.rate_mbit) == ("lan2460", 2460)
    default = load("pdd-smoke")
    assert topology_config(default.spec, default.profile, Path(tmp_path), False).lan_profile.name == "lan"
