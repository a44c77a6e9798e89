"""scripts/validate_sim.py fit: the real-compute constants from emulated runs' events, per variant and with each
variant's contention (pure logic on small event lists; the roofline is the catalogue's this-machine)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import validate_sim as vs  # noqa: E402
from experiments.sim.realcompute import Contention  # noqa: E402
from workers.modelled.catalogue import load_catalogue  # noqa: E402
from workers.modelled.roofline import Part, Roofline  # noqa: E402

MS = 1_000_000  # ns


def lone() -> Roofline:
    cat = load_catalogue()
    return Roofline(cat.accelerator("this-machine"), cat.model("default"))


def test_a_decode_span_leaves_out_the_mixed_steps_in_it_and_a_mixed_step_is_at_its_requests_context():
    # r1 decodes from t=0 to t=100 ms in 4 steps; one of them (40 ms) also carried r2's 100-token extend on 600
    # cached tokens: 3 decode steps in 60 ms, 20 ms each
    events = [
        {"event": "decode_open", "request_id": "r2", "t_ns": -5 * MS, "cached_tokens": 600},
        {"event": "first_token", "request_id": "r1", "t_ns": 0},
        {
            "event": "decode_step_mixed",
            "request_id": None,
            "t_ns": 50 * MS,
            "duration_ns": 40 * MS,
            "decode_tokens": 1,
            "chunk_tokens": 100,
            "requests": ["r2"],
        },
        {"event": "decode_done", "request_id": "r1", "t_ns": 100 * MS, "steps": 4, "mean_batch": 1.0},
    ]
    # a worker before 2026-12-06 also wrote first_token at index 1 (its first decode step's end): the span is the
    # earliest's
    events.insert(2, {"event": "first_token", "request_id": "r1", "t_ns": 20 * MS, "index": 1})
    s = vs.Samples()
    roof = lone()
    vs._decode_worker(events, roof, 49152, s)
    assert s.decode == [pytest.approx(0.020 / roof.decode_s([700]))]
    assert s.mixed == [(pytest.approx(roof.step([Part(1, 700, 1), Part(100, 600, 1)]).seconds), 0.040)]


def _run(tmp_path: Path, pools: dict, variant_defs: dict | None = None) -> Path:
    spec = {"pools": {r: {"workers": n} for r, n in pools.items()}, "variant_defs": variant_defs or {}}
    (tmp_path / "metadata.json").write_text(json.dumps({"spec": spec}))
    return tmp_path


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("colocated", Contention(1, 0)),
        ("pd-intra", Contention(2, 0)),
        ("pd-cross", Contention(2, 1)),
        ("pdd", Contention(3, 1)),
    ],
)
def test_a_runs_variant_has_the_contention_the_simulator_derives_from_its_spec(tmp_path, variant, expected):
    assert vs.run_mode(_run(tmp_path, {"p": 1, "rld": 1, "md": 1}), variant) == (variant, expected)


def test_pools_and_a_variant_defs_mode_count(tmp_path):
    run = _run(tmp_path, {"p": 2, "rld": 1, "md": 3}, {"pdd-wide": {"mode": "pdd"}, "near": {"mode": "pd-intra"}})
    assert vs.run_mode(run, "pdd-wide") == ("pdd", Contention(engines=6, wan_senders=2))
    assert vs.run_mode(run, "near") == ("pd-intra", Contention(engines=3, wan_senders=0))


def test_the_joint_fit_recovers_the_slowdowns_its_samples_were_made_with():
    truth = vs.ContentionFit(0.05, 1.5, 0.03, 0.9, 0.7, 0.004, 4e-5, engine_slowdown=0.3, wan_sender_slowdown=0.6)
    by_variant = {}
    for variant, busy in {
        "colocated": Contention(1, 0),
        "pd-intra": Contention(2, 0),
        "pd-cross": Contention(2, 1),
        "pdd": Contention(3, 1),
    }.items():
        slow = truth.slowdown(busy)
        xs = [0.05, 0.1, 0.2, 0.3, 0.45]
        by_variant[variant] = vs.Samples(
            p_steps=[] if variant == "colocated" else [(x, (0.05 + 1.5 * x) * slow) for x in xs],
            mixed=[] if variant in ("pd-intra", "pd-cross") else [(x, (0.03 + 0.9 * x) * slow) for x in xs],
            decode=[0.7 * slow] * 5,
            imports=[] if variant == "colocated" else [(n, (0.004 + 4e-5 * n) * slow) for n in (20, 200, 700)],
            contention=busy,
        )
    got = vs.fit_contention(by_variant)
    assert got.engine_slowdown == pytest.approx(0.3, rel=0.02)
    assert got.wan_sender_slowdown == pytest.approx(0.6, rel=0.02)
    assert got.decode_factor == pytest.approx(0.7, rel=0.02)
    assert got.p_step_factor == pytest.approx(1.5, rel=0.02)


def test_a_variants_slowdowns_are_its_median_measured_over_the_pooled_constants_time():
    c = vs.PooledConstants(p_step=(0.1, 1.0), mixed_step=(0.02, 1.0), decode_factor=0.5, import_=(0.004, 4e-5))
    s = vs.Samples(
        p_steps=[(0.1, 0.4), (0.2, 0.45), (0.3, 1.2)],  # 2.0x, 1.5x, 3.0x the pooled P step
        decode=[0.5, 1.0],  # 1.0x, 2.0x
        imports=[(100, 0.024)],  # 3.0x (0.008 s pooled)
        mode="pd-intra",
    )
    assert vs.slowdowns({"near": s}, c) == {"pd-intra": (pytest.approx(2.0), pytest.approx(2.0))}


def test_the_pooled_slowdown_is_the_count_models_mean_over_the_fits_events():
    f = vs.ContentionFit(0.05, 1.5, 0.03, 0.9, 0.7, 0.004, 4e-5, engine_slowdown=0.1, wan_sender_slowdown=0.5)
    alone = vs.Samples(decode=[1.0] * 3, contention=Contention(1, 0))  # slowdown 1.0, 3 events
    pdd = vs.Samples(p_steps=[(0.1, 0.2)], imports=[(10, 0.01)], contention=Contention(3, 1))  # 1.7, 2 events
    assert vs.pooled_slowdown(f, {"colocated": alone, "pdd": pdd}) == pytest.approx((3 * 1.0 + 2 * 1.7) / 5)


def _variant_events(run: Path, variant: str, p_events: list[dict]) -> None:
    events = run / "variants" / variant / "events"
    events.mkdir(parents=True)
    (events / "p1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in p_events))


def test_fit_reads_only_the_variants_it_is_given(tmp_path):
    run = _run(tmp_path, {"p": 1, "rld": 1, "md": 1})
    step = {"event": "prefill_step", "chunks": [["r1", 512, 40, True]], "duration_ns": 200 * MS}
    _variant_events(run, "pd-intra", [step])
    _variant_events(run, "pd-cross", [dict(step, duration_ns=900 * MS), dict(step, duration_ns=800 * MS)])
    only = vs.samples([run], ("pd-intra",))
    assert list(only) == ["pd-intra"] and [m for _x, m in only["pd-intra"].p_steps] == [0.2]
    assert sorted(vs.samples([run])) == ["pd-cross", "pd-intra"]


def test_a_runs_p_busy_time_is_each_p_workers_busy_share_of_the_duration():
    variant = {
        "duration_s": 40.0,
        "workers": {
            "p1": {"role": "p", "busy_pct": 25.0},
            "p2": {"role": "p", "busy_pct": 10.0},
            "rld1": {"role": "rld", "busy_pct": None},
        },
    }
    assert vs.emulated_p_busy_s(variant) == pytest.approx(10.0 + 4.0)
    assert vs.emulated_p_busy_s({"duration_s": 40.0, "workers": {"rld1": {"role": "rld"}}}) is None


def test_the_p_level_is_the_median_of_emulated_over_simulated_busy_time():
    # three runs: 1.5x, 2x and 0.9x the simulated P's busy time; one far-off run does not move a median
    assert vs.p_level([(15.0, 10.0), (20.0, 10.0), (9.0, 10.0)]) == pytest.approx(1.5)
    assert vs.p_level([(15.0, 10.0), (20.0, 10.0), (9.0, 10.0), (90.0, 10.0), (14.0, 10.0)]) == pytest.approx(1.5)
