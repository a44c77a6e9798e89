"""Faults under load, in the real topology: every component killed mid-run, the WAN down for 20 s, 30% loss.

Three experiments (tiny model, pdd, a few concurrent sessions over ~20 s; process runtime unless said):

- kills: one variant per target (the spec's `faults:`): P, the RLD, the MD, the router, the load
  generator, each SIGKILLed KILL_AT_S into its variant's window, and last the userspace emulator (the WAN
  stops forwarding for good, so it goes last);
- wan: 30% loss both ways for 10 s, then a 20 s outage (100% loss both ways);
- one-way: a one-way partition (100% loss A->B for 10 s), then the other way (B->A);
- docker-kills: the RLD and the MD each SIGKILLed in the Docker runtime, where the kill ends the role's
  container;
- md-after-handoff: the MD SIGKILLed on the first handoff after KILL_AT_S (the fault's `after` cue), while
  it decodes the request it took over (single-turn requests with long outputs, so it has tens of tokens
  left): the router resumes that request on the RLD.

For each variant: every workload request is accounted for in requests.jsonl (its tokens where it
completed, equal to the greedy reference; otherwise a recorded error, or never sent); requests end within
the spec's request timeout; no role the fault spared had to be SIGKILLed at teardown (none hung); the
summary counts the failures by cause; and nothing is left after teardown (the tier's autouse fixture).
"""

import json

import pytest

from experiments.rundir import clientlog
from experiments.run import deploy, runner
from experiments.analysis import records
from experiments.spec.experiment import load_spec

pytestmark = [pytest.mark.emulation, pytest.mark.slow]

KILL_AT_S = 4.0
TARGETS = ("p", "rld", "md", "router", "loadgen", "emulator")  # the emulator last: the WAN stays dead
DOCKER_TARGETS = ("rld", "md")  # also in the Docker runtime: its kill ends the role's container
REQUEST_S = 30
LOSS = (2, 12, 30)  # s into the window: from, to, loss %
OUTAGE = (14, 34)  # s: 100% loss both ways
ONE_WAY = ((2, 10), (14, 10))  # (from s, for s): A->B down, then B->A down

WORKLOAD = [
    "model=tiny",
    "runtime=process",
    "profile=wan-cross-country",
    "workload.synthetic.sessions=3",
    "workload.synthetic.turns=[5, 6]",
    "workload.synthetic.session_rate_per_s=1.0",
    "workload.synthetic.think_s_mean=1.5",
    "deployment.kv.wan={stall_timeout_ms: 1000, deadline_ms: 20000}",
    "deployment.decode={kv_wait_ms: 20000, handoff_timeout_ms: 5000}",
    f"timeouts={{ready_s: 60, request_s: {REQUEST_S}, issue_s: 60, variant_s: 120}}",
]


def _run(tmp_path_factory, name: str, overrides: list[str]):
    spec = load_spec("pdd-smoke", [*WORKLOAD, *overrides])
    out = runner.run(spec, results=tmp_path_factory.mktemp(name))
    meta = json.loads((out / "metadata.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return out, meta, summary


@pytest.fixture(scope="module")
def kills(tmp_path_factory):
    defs = ", ".join(f"kill-{t}: {{mode: pdd}}" for t in TARGETS)
    faults = ", ".join(f"{{kill: {t}, at_s: {KILL_AT_S}, variants: [kill-{t}]}}" for t in TARGETS)
    return _run(
        tmp_path_factory,
        "kills",
        [f"variant_defs={{{defs}}}", f"variants=[{', '.join(f'kill-{t}' for t in TARGETS)}]", f"faults=[{faults}]"],
    )


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    lossy = f"{{at_s: {LOSS[0]}, duration_s: {LOSS[1] - LOSS[0]}, direction: both, set: {{loss_pct: {LOSS[2]}}}}}"
    down = f"{{at_s: {OUTAGE[0]}, duration_s: {OUTAGE[1] - OUTAGE[0]}, direction: both, set: {{loss_pct: 100}}}}"
    schedule = f"schedule=[{lossy}, {down}]"
    return _run(tmp_path_factory, "wan", ["variants=[pdd]", schedule])


@pytest.fixture(scope="module")
def one_way(tmp_path_factory):
    """A one-way partition each way in turn: A->B down (P's KV and the handoffs cannot reach the MD, its
    tokens still come back), then B->A down (the MD's tokens and the KV's ACKs cannot come back)."""
    there = f"{{at_s: {ONE_WAY[0][0]}, duration_s: {ONE_WAY[0][1]}, direction: a_to_b, set: {{loss_pct: 100}}}}"
    back = f"{{at_s: {ONE_WAY[1][0]}, duration_s: {ONE_WAY[1][1]}, direction: b_to_a, set: {{loss_pct: 100}}}}"
    return _run(tmp_path_factory, "one-way", ["variants=[pdd]", f"schedule=[{there}, {back}]"])


def _client_log(out, variant: str) -> dict[str, clientlog.ClientRecord]:
    return {r.request_id: r for r in clientlog.read(out / "variants" / variant / "client.jsonl")}


def check_accounted(out, meta, summary, variant: str, reference) -> dict:
    """Every workload request ended with its tokens (equal to the reference) or a recorded error; returns
    the variant's summary figures."""
    recs = [r for r in records.read(out) if r.variant == variant and r.kind != "warmup"]
    workload = [json.loads(line) for line in (out / "workload.jsonl").read_text().splitlines()]
    assert len(recs) == sum(w["kind"] != "warmup" for w in workload), "a request is missing from requests.jsonl"
    log = _client_log(out, variant)
    for r in recs:
        if r.ok:
            sent = log[r.request_id]
            reference(sent.prompt, r.token_ids, f"{variant} {r.request_id}")
        else:
            assert r.error or not r.issued, f"{r.request_id}: neither tokens nor an error"
        if r.e2e_ms is not None:
            assert r.e2e_ms <= (REQUEST_S + 5) * 1e3, f"{r.request_id} took {r.e2e_ms:.0f} ms"
    v = summary["variants"][variant]
    assert v["completed"] + v["failed"] + v["not_issued"] == v["requests"] == len(recs)
    if v["failed"]:
        assert v["errors"], "failures without their errors in the summary"
    return v


def _log_tail(out, variant: str, worker: str, lines: int = 30) -> str:
    path = out / "variants" / variant / "logs" / f"{worker}.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"({path} missing)"


RLD_ONLY_ROUTES = {"p-rld", "p-rld-singular", "p-rld-fallback", "p-rld-ablation"}  # routes without an MD
KILLED_CODES = (-9, 137)  # SIGKILL: a process's returncode; a container's exit status (128 + 9)


def check_nobody_hung(out, meta, variant: str, killed: str | None) -> None:
    """Every role the fault spared exited 0 at teardown (its SIGTERM handler ran: it neither hung until the
    SIGKILL nor crashed); the killed role's worker shows the SIGKILL."""
    codes = meta["variants"][variant]["exit_codes"]  # by worker name (the killed role's: its first worker)
    spared = {w: code for w, code in codes.items() if killed is None or deploy.role_of(w) != killed}
    assert spared, codes
    for w, code in spared.items():  # the failing role's log ends the message: what it printed as it died
        assert code == 0, f"a spared role did not exit 0: {codes}; {w}'s log ends:\n{_log_tail(out, variant, w)}"
    if killed is not None:
        hit = {w: code for w, code in codes.items() if deploy.role_of(w) == killed}
        assert hit and all(code in KILLED_CODES for code in hit.values()), f"{killed} not SIGKILLed: {codes}"


@pytest.fixture(scope="module")
def docker_kills(tmp_path_factory):
    """The roles whose kill differs in the Docker runtime (the container, not a process) killed there."""
    defs = ", ".join(f"kill-{t}: {{mode: pdd}}" for t in DOCKER_TARGETS)
    faults = ", ".join(f"{{kill: {t}, at_s: {KILL_AT_S}, variants: [kill-{t}]}}" for t in DOCKER_TARGETS)
    variants = f"variants=[{', '.join(f'kill-{t}' for t in DOCKER_TARGETS)}]"
    return _run(
        tmp_path_factory, "docker-kills", [f"variant_defs={{{defs}}}", variants, f"faults=[{faults}]", "runtime=docker"]
    )


@pytest.fixture(scope="module")
def md_after_handoff(tmp_path_factory):
    long_outputs = [
        "workload.synthetic.sessions=8",
        "workload.synthetic.turns=[1, 1]",
        "workload.synthetic.session_rate_per_s=2.0",
        "workload.synthetic.system_prompt_tokens=16",
        "workload.synthetic.output_tokens=[80, 96]",
        "workload.synthetic.fresh_requests=0",
        "workload.synthetic.singular_fraction=0.0",
    ]
    fault = f"faults=[{{kill: md, at_s: {KILL_AT_S / 2}, after: handoff_end}}]"
    # wan-regional: the MD holds the prompt KV within a few RLD tokens (cross-country: after the RLD is done)
    return _run(tmp_path_factory, "md-after-handoff", [*long_outputs, "profile=wan-regional", "variants=[pdd]", fault])


@pytest.mark.parametrize("target", TARGETS)
def test_a_component_killed_mid_run(kills, reference, target):
    check_kill(kills, reference, target)


@pytest.mark.parametrize("target", DOCKER_TARGETS)
def test_a_role_container_killed_mid_run(docker_kills, reference, target):
    _, meta, _ = docker_kills
    assert meta["runtime"] == "docker"
    check_kill(docker_kills, reference, target)


def check_kill(run, reference, target: str) -> None:
    out, meta, summary = run
    variant = f"kill-{target}"
    window = meta["variants"][variant]
    [fault] = window["faults"]
    print(variant, "fault:", fault, "status:", window["status"])
    assert fault["played"] and fault.get("pid") and "error" not in fault, fault
    assert abs(fault["offset_s"] - KILL_AT_S) < 1.0
    v = check_accounted(out, meta, summary, variant, reference)
    print(
        f"{variant}: {v['completed']} completed, {v['failed']} failed, {v['not_issued']} not sent; "
        f"fallbacks {v['fallbacks']}; errors {v['errors'][:3]}"
    )
    check_nobody_hung(out, meta, variant, target if target in ("p", "rld", "md", "router") else None)
    assert v["completed"] > 0, "nothing completed before the fault"
    if target == "md":  # the RLD serves what the MD would have: nothing is lost
        assert v["failed"] == 0 and v["fallbacks"], v
    if target == "rld":  # P->RLD->MD requests complete on the MD (only RLD-only routes fail)
        assert not [e for e in v["errors"] if "every worker stream ended" in e], v["errors"]
        failed = {r.request_id: r.route for r in records.read(out) if r.variant == variant and r.issued and not r.ok}
        assert set(failed.values()) <= RLD_ONLY_ROUTES, f"failed requests outside the RLD-only routes: {failed}"
    if target in ("router", "p"):  # the request path is gone: later requests fail, each with its error
        assert v["failed"] > 0 and v["fallbacks"].get("failed", 0) + len(v["errors"]) > 0, v
    if target == "loadgen":  # requests it never logged are counted against the workload
        assert v["failed"] + v["not_issued"] > 0, v
    if target == "emulator":  # the WAN is gone for good: pdd serves from cluster A
        assert v["failed"] == 0, v


def test_the_wan_down_for_20_s_and_30_percent_loss(wan, reference):
    out, meta, summary = wan
    v = check_accounted(out, meta, summary, "pdd", reference)
    print(f"wan: {v['completed']} completed, {v['failed']} failed; fallbacks {v['fallbacks']}")
    assert v["failed"] == 0 and v["completed"] == v["requests"], v["errors"]
    assert v["fallbacks"], "the outage caught no request"
    check_nobody_hung(out, meta, "pdd", None)


def test_a_one_way_partition_each_way(one_way, reference):
    out, meta, summary = one_way
    v = check_accounted(out, meta, summary, "pdd", reference)
    print(f"one-way: {v['completed']} completed, {v['failed']} failed; fallbacks {v['fallbacks']}")
    assert v["failed"] == 0 and v["completed"] == v["requests"], v["errors"]
    assert v["fallbacks"], "the partitions caught no request"
    check_nobody_hung(out, meta, "pdd", None)


def test_the_md_killed_after_it_took_over_a_request(md_after_handoff, reference):
    out, meta, summary = md_after_handoff
    [fault] = meta["variants"]["pdd"]["faults"]
    print("fault:", fault)
    assert fault["played"] and fault.get("pid") and "error" not in fault, fault
    assert fault["after"]["event"] == "handoff_end", fault
    v = check_accounted(out, meta, summary, "pdd", reference)
    print(f"md-after-handoff: {v['completed']} completed, {v['failed']} failed; fallbacks {v['fallbacks']}")
    check_nobody_hung(out, meta, "pdd", "md")
    # nothing is lost: the request the MD was decoding resumes on the RLD, later ones are served in cluster A
    assert v["failed"] == 0 and v["completed"] == v["requests"], v["errors"]
    assert v["fallbacks"].get("resumed_on_rld", 0) >= 1, v["fallbacks"]
    recs = {r.request_id: r for r in records.read(out) if r.variant == "pdd"}
    resumed = recs[fault["after"]["request_id"].removeprefix("pdd.")]  # the router's ids are <variant>.<id>
    assert "resumed_on_rld" in resumed.fallbacks, resumed.fallbacks
    workers = resumed.token_workers
    assert "md1" in workers and workers[-1] == "rld1", workers  # the MD decoded, then the RLD took it back
    took, back = workers.index("md1"), len(workers) - workers[::-1].index("md1")
    print(f"{resumed.request_id}: the MD decoded tokens {took}..{back - 1} of {len(workers)}; the RLD the rest")


# ---- hung roles and hostile KV peers (issue 28): a role SIGSTOPped for a while, abusive KV connections

STOP_TARGETS = ("p", "rld", "md")
STOP_S = 5.0  # each stopped this long from KILL_AT_S, then resumed
HOSTILE_S = 10.0  # hostile KV connections to the MD from KILL_AT_S for this long


def hang_overrides() -> list[str]:
    """stop-p, stop-rld, stop-md (each role SIGSTOPped STOP_S at KILL_AT_S) and hostile-md (hostile_kv on
    the MD for HOSTILE_S): the spec overrides of the `hangs` experiment."""
    names = [*(f"stop-{t}" for t in STOP_TARGETS), "hostile-md"]
    defs = ", ".join(f"{n}: {{mode: pdd}}" for n in names)
    stops = [f"{{stop: {t}, at_s: {KILL_AT_S}, duration_s: {STOP_S}, variants: [stop-{t}]}}" for t in STOP_TARGETS]
    hostile = f"{{hostile_kv: md, at_s: {KILL_AT_S}, duration_s: {HOSTILE_S}, variants: [hostile-md]}}"
    return [f"variant_defs={{{defs}}}", f"variants=[{', '.join(names)}]", f"faults=[{', '.join([*stops, hostile])}]"]


@pytest.fixture(scope="module")
def hangs(tmp_path_factory):
    return _run(tmp_path_factory, "hangs", hang_overrides())


@pytest.mark.parametrize("target", STOP_TARGETS)
def test_a_role_stopped_for_5_s_mid_run(hangs, reference, target):
    out, meta, summary = hangs
    variant = f"stop-{target}"
    window = meta["variants"][variant]
    [fault] = window["faults"]
    print(variant, "fault:", fault, "status:", window["status"])
    assert fault["played"] and fault.get("pid") and "error" not in fault, fault
    assert fault["stop"] == target and fault["resumed"], fault
    assert abs(fault["offset_s"] - KILL_AT_S) < 1.0
    assert abs(fault["resumed_offset_s"] - fault["offset_s"] - STOP_S) < 1.0, fault
    v = check_accounted(out, meta, summary, variant, reference)  # lost = 0: every request has its record
    print(
        f"{variant}: {v['completed']} completed, {v['failed']} failed, {v['not_issued']} not sent; "
        f"fallbacks {v['fallbacks']}; errors {v['errors'][:3]}"
    )
    check_nobody_hung(out, meta, variant, None)  # resumed: the stopped role too exits 0 at teardown
    assert v["completed"] > 0, "nothing completed"


def test_hostile_kv_peers_at_the_md_mid_run(hangs, reference):
    out, meta, summary = hangs
    window = meta["variants"]["hostile-md"]
    [fault] = window["faults"]
    print("hostile-md fault:", fault, "status:", window["status"])
    assert fault["played"] and fault.get("pid") and "error" not in fault, fault
    assert fault["hostile_kv"] == "md" and fault["exit"] == 0 and fault["peer"]["connections"] > 0, fault
    v = check_accounted(out, meta, summary, "hostile-md", reference)
    print(f"hostile-md: {v['completed']} completed, {v['failed']} failed; fallbacks {v['fallbacks']}")
    assert v["failed"] == 0 and v["completed"] == v["requests"], v["errors"]
    check_nobody_hung(out, meta, "hostile-md", None)
