"""The router's per-request line choice (policy.pick_md: line_measured): each MD sits behind one line, and the
request goes to the MD whose line delivers its KV soonest, its load counted as time; the lines' static figures
until P has measured them; a line gone stale gets a request to explore it. Pure logic and the router's
bookkeeping with a fake clock; the config's refusals."""

import math

import pytest

from workers.roles.config import ConfigError, RouterPolicy, parse_config
from workers.roles.pools import Pools
from workers.roles.routing import LineContext, LineView, WorkerLoad, decide_route, pick_md
from workers.roles.wanestimate import WanEstimate

KV = 512  # bytes per token (the tiny model's)
CAP = dict(load_cap=8, balance_abs=4, balance_rel=1.5)
FAST = LineView("fast", rate_mbit=1000, delay_ms=10)
CHEAP = LineView("cheap", rate_mbit=200, delay_ms=30)
LINE_OF = {"md1": "fast", "md2": "cheap", "md3": "fast", "md4": "cheap"}


def W(name, sessions=0, hit=0):
    return WorkerLoad(name, sessions, 0, 4096, True, hit)


def ctx(kv_bytes, fast=FAST, cheap=CHEAP, ms_per_session=5.0, explore_s=0.0):
    return LineContext({"fast": fast, "cheap": cheap}, LINE_OF, kv_bytes, ms_per_session, explore_s)


def pick(loads, lines, **kw):
    return pick_md(loads, "line_measured", 0, lines=lines, **{**CAP, **kw})


def test_static_figures_send_a_big_prompt_over_the_fast_line_until_its_md_is_loaded():
    big = {name: 120 * KV for name in LINE_OF}  # 61,440 B: fast 0.49 + 10 ms, cheap 2.46 + 30 ms
    p = pick([W("md1"), W("md2")], ctx(big))
    assert (p.worker, p.reason) == ("md1", "line")
    costs = dict(p.costs_ms)
    assert math.isclose(costs["md1"], 61_440 * 8 / 1e6 + 10) and math.isclose(costs["md2"], 61_440 * 8 / 2e5 + 30)
    # five sessions on md1 cost 25 ms: 35.5 ms > 32.5 ms on the idle cheap line
    assert pick([W("md1", 5), W("md2")], ctx(big)).worker == "md2"
    assert pick([W("md1", 4), W("md2")], ctx(big)).worker == "md1"
    # with the load not counted, the fast line keeps it
    assert pick([W("md1", 5), W("md2")], ctx(big, ms_per_session=0)).worker == "md1"
    # two MDs per line: the less loaded of the fast line's
    assert pick([W("md1", 2), W("md2"), W("md3"), W("md4")], ctx(big)).worker == "md3"


def test_a_measurement_overturns_the_static_guess():
    big = {name: 120 * KV for name in LINE_OF}
    slow_fast = WanEstimate(rate_mbit=20, rtt_ms=200, min_rtt_ms=190, samples=3)  # 24.6 + 100 ms
    p = pick([W("md1"), W("md2")], ctx(big, fast=LineView("fast", 1000, 10, slow_fast)))
    assert (p.worker, p.reason) == ("md2", "line")
    assert math.isclose(dict(p.costs_ms)["md1"], 61_440 * 8 / 2e4 + 100)
    unmeasured = WanEstimate(samples=2)  # RTT samples but no rate yet: still the static figures
    assert pick([W("md1"), W("md2")], ctx(big, fast=LineView("fast", 1000, 10, unmeasured))).worker == "md1"


def test_the_drc_hit_counts_as_bytes_the_line_need_not_carry():
    kv = 131_072  # a big model's KV per token (modelled compute)
    # md2 (cheap) holds 990 of 1000 tokens: 10 x 128 KiB = 52 + 30 ms; md1 (fast) holds none: 1049 + 10 ms
    p = pick([W("md1"), W("md2", hit=990 * 16)], ctx({"md1": 1000 * kv, "md2": 10 * kv}))
    assert p.worker == "md2"
    assert pick([W("md1"), W("md2")], ctx({"md1": 1000 * kv, "md2": 1000 * kv})).worker == "md1"


def test_the_load_cap_holds_and_says_so():
    big = {name: 120 * KV for name in LINE_OF}
    p = pick([W("md1", 2), W("md2", 0)], ctx(big, ms_per_session=0), load_cap=2)
    assert (p.worker, p.reason) == ("md2", "cap")
    assert pick([W("md1", 2), W("md2", 2)], ctx(big, ms_per_session=0), load_cap=2).worker == "md1"  # all at it


def test_a_stale_line_gets_a_request_to_explore_it_the_stalest_first():
    big = {name: 120 * KV for name in LINE_OF}
    stale_cheap = LineView("cheap", 200, 30, idle_s=12)
    p = pick([W("md1"), W("md2")], ctx(big, cheap=stale_cheap, explore_s=10))
    assert (p.worker, p.reason) == ("md2", "explore")
    assert pick([W("md1"), W("md2")], ctx(big, cheap=LineView("cheap", 200, 30, idle_s=9), explore_s=10)).reason == (
        "line"
    )
    assert pick([W("md1"), W("md2")], ctx(big, cheap=stale_cheap, explore_s=0)).reason == "line"  # 0: never
    both = ctx(big, fast=LineView("fast", 1000, 10, idle_s=20), cheap=stale_cheap, explore_s=10)
    assert pick([W("md1"), W("md2")], both).worker == "md1"  # idle 20 s > 12 s
    # an MD at its cap does not explore
    assert pick([W("md1"), W("md2", 8)], ctx(big, cheap=stale_cheap, explore_s=10)).worker == "md1"


def test_line_measured_without_its_context_is_a_programming_error():
    with pytest.raises(ValueError, match="lines"):
        pick_md([W("md1"), W("md2")], "line_measured", 0, **CAP)


def test_the_route_decision_rests_on_the_chosen_lines_figures():
    policy = RouterPolicy(direct_max_transfer_ms=20, wan_rate_mbit=200)
    # 20 uncached tokens: 10,240 B. The one WAN: serialisation at wan_rate_mbit (0.41 ms), so P->MD
    assert decide_route("pdd", 100, 16, 80, KV, policy).route == "p-md"
    # a 2 Mbit/s line's static rate instead: 41 ms > 20 ms, so P->RLD->MD (no delay term, as on one WAN)
    d = decide_route("pdd", 100, 16, 80, KV, policy, None, LineView("slow", 2, 30))
    assert d.route == "p-rld-md" and math.isclose(d.wan_estimate_ms, 10_240 * 8 / 2e3)
    assert decide_route("pdd", 100, 16, 80, KV, policy, None, CHEAP).route == "p-md"
    measured = RouterPolicy(direct_max_transfer_ms=20, wan_estimate="measured")
    near = WanEstimate(rate_mbit=200, rtt_ms=2, min_rtt_ms=2, samples=4)
    d = decide_route("pdd", 100, 16, 80, KV, measured, near, LineView("slow", 2, 30))  # measured beats static
    assert d.route == "p-md" and d.wan_source == "measured"


# ---------------------------------------------------------------- the router's bookkeeping

LINES = {"fast": {"rate_mbit": 1000, "delay_ms": 10}, "cheap": {"rate_mbit": 200, "delay_ms": 30}}


def _cfg_dict(md_lines=("fast", "cheap"), **policy):
    md = [
        {"name": f"md{i + 1}", "grpc_port": 20 + i, "kv_port": 40 + i, **({"line": ln} if ln is not None else {})}
        for i, ln in enumerate(md_lines)
    ]
    return {
        "router": {"name": "router", "grpc_port": 1},
        "p": {"name": "p1", "grpc_port": 2},
        "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
        "md": md,
        "policy": policy,
    }


def test_pools_pick_by_line_remember_measurements_and_explore_a_stale_line():
    now = [100.0]
    cfg = parse_config(_cfg_dict(pick_md="line_measured", lines=LINES, line_explore_s=10))
    pools = Pools(cfg, clock=lambda: now[0])
    big = {"md1": 61_440, "md2": 61_440}

    def choose():
        c = pools.choose("md", {}, big)
        pools.release(c)
        return c

    first = choose()
    assert (first.worker.name, first.pick.reason) == ("md1", "line")
    assert set(first.record()["costs_ms"]) == {"md1", "md2"}
    now[0] = 105.0
    pools.lines.report("p1", "fast", WanEstimate(rate_mbit=20, rtt_ms=200, min_rtt_ms=190, samples=3))
    assert choose().worker.name == "md2"  # measured: fast is slow now
    assert pools.lines.record()["fast"] == {
        "source": "measured",
        "rate_mbit": 20.0,
        "delay_ms": 100.0,
        "congested": False,
        "samples": 3,
        "idle_s": 0.0,
    }
    assert pools.lines.record()["cheap"]["source"] == "static"
    pools.lines.report("p1", "fast", WanEstimate(rate_mbit=900, rtt_ms=20, min_rtt_ms=20, samples=5))
    now[0] = 111.0  # cheap: never measured since the start (11 s); fast measured 6 s ago
    explore = choose()
    assert (explore.worker.name, explore.pick.reason) == ("md2", "explore")
    assert choose().pick.reason == "line"  # explored: it waits another 10 s
    now[0] = 113.0
    pools.lines.report("p1", "fast", WanEstimate(rate_mbit=900, rtt_ms=20, min_rtt_ms=20, samples=5))  # not new
    now[0] = 116.0
    assert (choose().worker.name, pools.lines.view("fast").idle_s) == ("md1", 0.0)  # explored fast at 11 s idle
    assert pools.lines.view("") is None and pools.lines.names == ["fast", "cheap"]


def test_the_one_wan_keeps_its_single_estimate():
    pools = Pools(parse_config(_cfg_dict(md_lines=(None, None))))
    assert pools.lines.names == [] and pools.lines.estimate("") is None
    pools.lines.report("p1", "", WanEstimate(rate_mbit=50, rtt_ms=60, min_rtt_ms=60, samples=1))
    assert pools.lines.estimate("").rate_mbit == 50
    assert pools.lines.record() == {}


@pytest.mark.parametrize(
    "md_lines,policy,needle",
    [
        (("fast", "fast"), {"pick_md": "line_measured", "lines": LINES}, "policy.lines.cheap: no MD sits"),
        (
            ("fast", "fast"),
            {"pick_md": "line_measured", "lines": {"fast": LINES["fast"]}},
            "policy.pick_md=line_measured needs MDs behind two lines or more (md.line); named: ['fast']",
        ),
        ((None, None), {"pick_md": "line_measured"}, "policy.pick_md=line_measured needs MDs behind two lines"),
        (
            ("fast", "cheap"),
            {"pick_md": "line_measured", "lines": {"fast": LINES["fast"]}},
            "policy.lines.cheap: required by pick_md line_measured (md[1].line='cheap')",
        ),
        (("fast", None), {}, "md[1].line: empty while other MDs name lines ['fast']"),
        (("fast", "cheap"), {"lines": {"fast": {"rate_mbit": 0}}}, "policy.lines.fast.rate_mbit=0 out of range"),
        (("fast", "cheap"), {"lines": {"fast": {"delay_ms": 5}}}, "policy.lines.fast.rate_mbit: required"),
        (("fast", "cheap"), {"lines": {"fast": {"rate_mbit": 1, "loss": 1}}}, "policy.lines.fast: unknown key(s)"),
        (("fast", "Cheap!"), {}, "md[1].line: String should match pattern"),
        (("fast", "cheap"), {"line_explore_s": -1}, "policy.line_explore_s=-1 out of range"),
        (("fast", "cheap"), {"line_ms_per_session": "5"}, "policy.line_ms_per_session: expected float"),
    ],
)
def test_line_config_errors_name_the_field(md_lines, policy, needle):
    with pytest.raises(ConfigError) as info:
        parse_config(_cfg_dict(md_lines, **policy))
    assert needle in str(info.value)


def test_only_an_md_sits_behind_a_line_and_a_valid_line_config_loads():
    data = _cfg_dict()
    data["p"]["line"] = "fast"
    with pytest.raises(ConfigError, match=r"p.line='fast': only an MD sits behind a line"):
        parse_config(data)
    cfg = parse_config(_cfg_dict(pick_md="line_measured", lines=LINES))
    assert [m.line for m in cfg.md] == ["fast", "cheap"] and cfg.policy.lines["cheap"].delay_ms == 30
