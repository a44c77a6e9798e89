"""Run an experiment spec: one topology, every variant on the same workload, a run directory.

Responsible for: building the workload and validating everything before the
topology starts; bringing the topology up with the spec's WAN profile and a
WAN capture; for each variant, starting fresh roles (so every variant's DRC
and prefix caches start equal), waiting for their gRPC health, running the
load generator in the `client` host with progress shown, opening the
variant's window at the load generator's t0 (experiments.run.window: the schedule
on the variant's clock, the cross traffic), holding it open until the
schedule's last event, checking the link's schedule (`Testbed.check`), and
stopping the roles; writing metadata.json after every step (`complete: false` until the
end, so Ctrl-C leaves an honest record); tearing everything down always; then
the analysis (experiments.analysis.analyze) over whatever was recorded.
Not responsible for: metrics or plots (experiments.analysis.analyze reads only the run
directory), the topology (topology.net), the roles (workers.roles).

Run directory (results/<time>-<experiment>/):

    metadata.json        resolved spec, profile, backend, seeds, provenance, per-variant windows, complete
                         (experiments.rundir.metadata: its layout, writer and reader)
    workload.jsonl       the requests, identical for every variant
    variants/<v>/        deployment.yaml, client.jsonl (raw), events/<worker>.jsonl, logs/<worker>.log,
                         cross/<flow>-<direction>.json (iperf3 -J of each cross flow)
    requests.jsonl       one line per request and variant (experiments.analysis.records)
    events.jsonl         every role's events of every variant, merged by t_ns
    summary.json, summary.md, plots/*.png, pcap/wan-{a,b}.pcap
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.run import deploy, window as winmod
from experiments.run import faults as faultsmod
from experiments.spec import faults as specfaults, experiment as specmod
from experiments.rundir import metadata, files as rundir
from experiments.spec import sites, workload as wl
from experiments.rundir.metadata import RunMetadata, Seeds, SharedTopologyRecord, VariantRecord
from experiments.spec.deployment import pool_cpusets, role_of
from experiments.run.loadgen import Settled
from experiments.spec.experiment import ExperimentSpec
from experiments.spec.order import REFERENCE_VARIANT, run_order
from experiments.spec.scaling import lan_profile, spec_scaling_record
from experiments.progress import Progress
from topology.profiles import Profile

log = logging.getLogger(__name__)
HEALTH_MARGIN_S = 30.0  # on top of the spec's ready_s: the health command's own start-up


class VariantError(RuntimeError):
    """A variant could not run (a role died or never became ready)."""


@dataclass(frozen=True)
class Plan:
    """A run's inputs, checked and built once before anything starts: the spec, its WAN profile parsed,
    the workload's requests."""

    spec: ExperimentSpec
    profile: Profile
    requests: tuple[wl.WorkloadRequest, ...]


def prepare(spec: ExperimentSpec, profile: Profile | None = None) -> Plan:
    """Everything that can fail before the topology: the profile (parsed here unless given: a Loaded spec's),
    the workload (trace lines), the runtime."""
    deploy.topology_kwargs(spec)
    if spec.cluster.address:  # an address that does not answer: one error before a run directory exists
        from ray_rt.cluster import check_reachable

        check_reachable(spec.cluster.address)
    return Plan(spec, specmod.parse_profile(spec) if profile is None else profile, tuple(wl.build(spec)))


def run(
    spec: ExperimentSpec | Plan,
    results: Path = rundir.RESULTS,
    out: Path | None = None,
    shared: SharedTopology | None = None,
) -> Path:
    """Run every variant of a spec (prepared here) or of a Plan (prepared already); return the run
    directory (analysed, even after Ctrl-C or a failure): `out` if given (it must not exist yet: a sweep
    names its points), else a new one under `results`. With `shared`, on that running topology (the link
    swapped to the spec's profile, captures into this run) instead of a topology of its own."""
    from topology.net import preflight

    plan = spec if isinstance(spec, Plan) else prepare(spec)
    spec, requests = plan.spec, list(plan.requests)
    if shared is None:
        if not spec.cluster.address:  # on an existing Ray cluster there is no topology to build
            preflight()
    elif not shared.fits(spec):
        raise ValueError(f"{spec.name}: the shared topology was built for another backend, runtime or seed")
    if out is None:
        out = rundir.new_run_dir(spec.name, results)
    else:
        out.mkdir(parents=True)
    wl.write(requests, out / "workload.jsonl")
    meta = new_metadata(
        spec,
        spec.name,
        workload=wl.hit_profile(requests),
        shared_topology=shared.record() if shared is not None else None,
    )
    metadata.write(out, meta)
    log.info("run directory: %s", out)
    try:
        with metadata.recording(out, meta):
            if spec.cluster.address:
                _run_cluster(spec, plan.profile, out, meta)
            elif shared is None:
                _run_topology(spec, plan.profile, out, meta)
            else:
                shared.run(spec, plan.profile, out, meta)
            meta.complete = complete(meta, spec)
            meta.speed_at_end = rundir.machine_speed()  # the topology is down: the machine as the run left it
    finally:
        analyze_safely(out)
    return out


def complete(meta: RunMetadata, spec: ExperimentSpec) -> bool:
    """A run is complete when every variant of its spec ran to the end with every request answered."""
    return set(meta.variants) == set(spec.variants) and all(v.status == "ok" for v in meta.variants.values())


def new_metadata(spec: ExperimentSpec, experiment: str, serve: bool = False, **fields) -> RunMetadata:
    """A run's metadata before its first step (complete: false): provenance, the spec, seeds and runtime; the
    caller's own sections (workload, shared_topology) in `fields`. A serve session (serve) has no workload seed:
    its requests are its clients'."""
    return RunMetadata(
        experiment=experiment,
        complete=False,
        provenance=rundir.provenance(speed=True),
        spec=specmod.to_dict(spec),
        seeds=Seeds(
            workload=None if serve else spec.workload.seed, weights=spec.weights_seed, topology=spec.topology_seed
        ),
        runtime=spec.runtime,
        line_scaling=spec_scaling_record(spec),
        **({"serve": True} if serve else {}),
        **fields,
    )


def analyze_safely(out: Path) -> None:
    """The analysis of a run directory, whatever happened before: a failure is logged with the command that
    reruns it, never raised (the run's own outcome is what the caller reports)."""
    from experiments.analysis import analyze

    try:
        analyze.analyze(out)
    except Exception:
        log.exception("analysis of %s failed (rerun: pddlab analyze %s)", out, out)


def topology_config(spec: ExperimentSpec, profile, out: Path, play_schedule: bool):
    """The topology a run of spec builds for itself: captures, logs and containers in out (also serve's)."""
    from topology.net import TopologyConfig

    return TopologyConfig(
        wan_profile=winmod.link_profile(spec, profile),
        lan_profile=lan_profile(spec),
        backend=spec.backend,
        capture_dir=out / "pcap",
        snaplen_bytes=spec.snaplen_bytes,
        seed=spec.topology_seed,
        log_dir=out / "logs",
        play_schedule=play_schedule,
        cross_hosts=bool(spec.cross_traffic),
        n_p=spec.pools.p.workers,
        n_rld=spec.pools.rld.workers,
        n_md=spec.pools.md.workers,
        topology=sites.topology_of(spec),
        **deploy.topology_kwargs(spec, out),
    )


def _run_topology(spec: ExperimentSpec, profile, out: Path, meta: RunMetadata) -> None:
    from topology.net import Testbed

    cfg = topology_config(spec, profile, out, play_schedule=spec.schedule_clock == "link")
    held = _HeldSignals()
    try:
        with Testbed(cfg) as tb:
            try:
                _run_variants(tb, spec, out, meta, winmod.impairment(spec, profile))
            finally:
                held.hold()  # a Ctrl-C now must not cut the teardown short: it is re-raised after it
    finally:
        held.release()


def _run_cluster(spec: ExperimentSpec, profile, out: Path, meta: RunMetadata) -> None:
    """Every variant on an existing Ray cluster (experiments.run.clusterbed): no emulated topology."""
    from experiments.run.clusterbed import ClusterBed

    held = _HeldSignals()
    try:
        with ClusterBed(spec, profile, out) as bed:
            try:
                _run_variants(bed, spec, out, meta, winmod.Impairment())
            finally:
                held.hold()
    finally:
        held.release()


def topology_key(spec: ExperimentSpec) -> tuple:
    """What a topology is built from, the WAN link aside: runs with equal keys can share one topology."""
    return (
        spec.backend,
        spec.runtime,
        spec.model,
        spec.weights_seed,
        spec.snaplen_bytes,
        spec.topology_seed,
        bool(spec.cross_traffic),
        spec.pools,
    )


def can_share(spec: ExperimentSpec) -> bool:
    """A run can use a shared topology unless its schedule runs on the link's clock (from link-up) or it runs
    on an existing Ray cluster (no topology)."""
    return spec.schedule_clock == "variant" and not spec.cluster.address


class SharedTopology:
    """One topology for several runs whose specs differ only in the link (and the workload): a sweep's
    points. Each run swaps the link to its profile, captures into its own pcap/, runs its variants with
    fresh roles as always, and leaves the topology up for the next; the emulator's log and the Docker
    containers' logs go to `root` (the sweep directory, which the containers mount)."""

    def __init__(self, spec: ExperimentSpec, root: Path, ident: int = 0):
        self.key, self.ident, self.runs = topology_key(spec), ident, 0
        # A run's own topology, but no captures of its own (each run captures into its directory) and its
        # logs beside the sweep's runs; the link's schedule plays on each run's variant clock (can_share).
        self.config = dataclasses.replace(
            topology_config(spec, specmod.parse_profile(spec), root, play_schedule=False),  # as applied (kv_scale)
            capture_dir=None,
            log_dir=root / "topology" / f"t{ident}",
        )
        self.tb = None
        self.started_s = 0.0

    def fits(self, spec: ExperimentSpec) -> bool:
        return topology_key(spec) == self.key and can_share(spec)

    def __enter__(self) -> "SharedTopology":
        from topology.net import Testbed

        t0 = time.monotonic()
        self.tb = Testbed(self.config).__enter__()
        self.started_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc) -> bool:
        held = _HeldSignals()
        held.hold()  # a Ctrl-C now must not cut the teardown short: it is re-raised after it
        try:
            if self.tb is not None:
                self.tb.__exit__(*exc)
        finally:
            held.release()
        return False

    def record(self) -> SharedTopologyRecord:
        """What metadata.json says of it: its id, how long it took to come up, how many runs used it before."""
        return SharedTopologyRecord(id=self.ident, runs_before=self.runs, start_s=round(self.started_s, 3))

    def run(self, spec: ExperimentSpec, profile, out: Path, meta: RunMetadata) -> None:
        self.runs += 1
        self.tb.swap_profile(profile)
        self.tb.capture_to(out / "pcap")
        try:
            _run_variants(self.tb, spec, out, meta, winmod.impairment(spec, profile))
        finally:
            self.tb.capture_to(None)  # the pcaps complete before the analysis reads them


class _HeldSignals:
    """SIGINT/SIGTERM/SIGHUP recorded instead of raised while held; release() restores them and re-raises."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.caught: int | None = None
        self.outer = {sig: signal.getsignal(sig) for sig in self.SIGNALS}  # before the Testbed set its own
        self.held = False

    def hold(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._record)
        self.held = True

    def _record(self, signum, frame) -> None:
        self.caught = signum
        log.warning("signal %d during teardown: finishing the teardown first", signum)

    def release(self) -> None:
        if self.held:
            for sig, handler in self.outer.items():
                signal.signal(sig, handler)
            self.held = False
        if self.caught is not None:
            raise KeyboardInterrupt(f"signal {self.caught}")


def _run_variants(tb, spec: ExperimentSpec, out: Path, meta: RunMetadata, imp: winmod.Impairment) -> None:
    """Every variant in turn (run_order) on the running testbed; metadata.json rewritten at each step."""
    meta.topology = metadata.topology_of(tb)
    meta.variant_order = run_order(spec)
    metadata.write(out, meta)
    log.info("variants run in this order: %s", ", ".join(meta.variant_order))
    for variant in meta.variant_order:
        window = meta.variants[variant] = VariantRecord(status="running")
        metadata.write(out, meta)
        try:
            run_variant(tb, spec, variant, out, imp, window)
        except VariantError as err:
            window.status, window.error = "failed", str(err)
            log.error("variant %s failed: %s", variant, err)
        except KeyboardInterrupt:
            window.status = "interrupted"
            raise
        finally:
            metadata.write(out, meta)
    meta.topology = metadata.topology_of(tb)  # with link changes


def run_variant(
    tb,
    spec: ExperimentSpec,
    variant: str,
    out: Path,
    imp: winmod.Impairment | None = None,
    window: VariantRecord | None = None,
) -> VariantRecord:
    """Fresh roles, readiness, the workload in its window, roles stopped; fills and returns the variant's
    record (window, status, link changes, cross traffic). Raises VariantError when the link's schedule or a
    cross flow failed (the record is filled first)."""
    from topology.net import TestbedError

    window = VariantRecord(status="running") if window is None else window
    vdir = out / "variants" / variant
    (vdir / "events").mkdir(parents=True, exist_ok=True)
    config = deploy.write_deployment(
        spec,
        vdir / "deployment.yaml",
        vdir / "events",
        mode=specmod.variant_mode(spec, variant),
        overrides=specmod.variant_overrides(spec, variant),
        wan=tb.config.wan_profile,  # the link as it runs (a sweep's shared topology swaps it per run)
        pools=specmod.variant_pools(spec, variant),
    )
    pools = specmod.variant_pools(spec, variant)
    runtime = deploy.make_runtime(tb, spec, config, vdir / "logs", pools, pool_cpusets(spec))
    win = winmod.VariantWindow(tb, imp or winmod.Impairment(), vdir, out)
    window.wall_start, window.t_start_ns = time.time(), time.monotonic_ns()
    log.info("variant %s: starting roles", variant)
    try:
        runtime.start()
    except RuntimeError as err:  # under Ray: a pool that cannot be placed, a driver that failed (nothing runs)
        window.status, window.error = "failed", str(err)
        raise VariantError(f"the roles did not start: {err}") from err
    try:
        wait_ready(tb, spec, runtime)
        window.t_ready_ns = time.monotonic_ns()
        status = _drive(tb, spec, variant, out, vdir, runtime, win, window)
        if status != "timeout":
            win.hold(variant)  # every variant meets the whole schedule
    except winmod.CrossTrafficFailed as err:
        raise VariantError(f"the variant's window could not open: {err}") from err
    finally:
        try:
            win.close(window)
        finally:
            window.exit_codes = runtime.stop()
            window.wall_end, window.t_end_ns = time.time(), time.monotonic_ns()
    window.status = status
    if win.start_ns is None and (win.imp.steps or win.imp.flows):  # loadgen's `start t0_ns=` line is the cue
        raise VariantError("the load generator never reported its t0: the schedule and cross traffic did not run")
    try:
        tb.check()
        win.check()
    except (TestbedError, winmod.CrossTrafficFailed) as err:
        raise VariantError(f"network impairment failed during the window: {err}") from err
    return window


def _python_in_host(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def wait_ready(tb, spec: ExperimentSpec, runtime: deploy.Runtime) -> None:
    """Every role's gRPC health SERVING, checked from the client host (the only way into the namespaces)."""
    addresses = [runtime.address(w) for w in runtime.workers]
    argv = _python_in_host("experiments.run.loadgen", "health", "--timeout-s", str(spec.timeouts.ready_s), *addresses)
    proc = tb.popen(
        "client",
        argv,
        cwd=deploy.REPO,
        env=deploy.worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        text, _ = proc.communicate(timeout=spec.timeouts.ready_s + HEALTH_MARGIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        text, _ = proc.communicate()
    if proc.returncode != 0:
        raise VariantError(
            f"roles not ready: {text.strip()[-500:]}; dead roles: {runtime.dead()} (logs in {runtime.log_dir})"
        )


def _drive(
    tb,
    spec: ExperimentSpec,
    variant: str,
    out: Path,
    vdir: Path,
    runtime: deploy.Runtime,
    win: winmod.VariantWindow,
    window: VariantRecord,
) -> str:
    """The load generator in the client host, the window opened at its t0 (after the warm-up), the spec's
    faults played from t0 (recorded in window.faults); progress logged; 'ok', 'failed_requests' or
    'timeout'."""
    reference = out / "variants" / REFERENCE_VARIANT / "client.jsonl"
    argv = _python_in_host(
        "experiments.run.loadgen",
        "run",
        "--workload",
        str(out / "workload.jsonl"),
        "--router",
        runtime.address("router"),
        "--variant",
        variant,
        "--mode",
        specmod.variant_mode(spec, variant),
        "--out",
        str(vdir / "client.jsonl"),
        "--request-timeout-s",
        str(spec.timeouts.request_s),
        "--issue-until-s",
        str(spec.timeouts.issue_s),
        *(["--reference", str(reference)] if variant != REFERENCE_VARIANT else []),
        *(["--handoff", ",".join(spec.handoff_per_request)] if spec.handoff_per_request else []),
        *_settle_args(spec, variant, runtime),
    )
    proc = tb.popen(
        "client",
        argv,
        cwd=deploy.REPO,
        env=deploy.worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    t0 = _T0()
    reader = threading.Thread(target=_show_progress, args=(proc, variant, t0, window), daemon=True)
    reader.start()
    deadline = time.monotonic() + spec.timeouts.variant_s
    player = None
    try:
        while not t0.seen.wait(0.05) and proc.poll() is None and time.monotonic() < deadline:
            pass
        if t0.seen.is_set():
            try:
                win.open(t0.ns)
            except BaseException:
                proc.terminate()  # the window could not open: the workload must not run without it
                proc.wait(10)
                raise
            player = faultsmod.FaultPlayer(
                specfaults.for_variant(spec.faults, variant),
                t0.ns,
                _killers(tb, runtime, proc),
                vdir / "events",
                **faultsmod.actions(tb, runtime),
            ).start()
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        log.error("variant %s: workload not done in %.0f s; stopping it", variant, spec.timeouts.variant_s)
        proc.terminate()
        proc.wait(10)
        return "timeout"
    finally:
        if player is not None:
            window.faults = player.stop()
        reader.join(5)
    if runtime.dead():
        log.error("variant %s: roles exited during the run: %s", variant, runtime.dead())
    return "ok" if code == 0 else "failed_requests"


SETTLE_MODES = ("pdd",)  # its warm-up's KV crosses the WAN into an MD's DRC (pd-cross's MD keeps no DRC)


def _settle_args(spec: ExperimentSpec, variant: str, runtime: deploy.Runtime) -> list[str]:
    """loadgen's --settle arguments: the variant's MDs where its mode brings the warm-up to one (the clock
    starts once an MD's DRC holds it; the wait counts against variant_s, so at most a quarter of it), else
    none."""
    if not spec.workload.warmup or specmod.variant_mode(spec, variant) not in SETTLE_MODES:
        return []
    mds = [runtime.address(w) for w in runtime.workers if role_of(w) == "md"]
    return [
        "--block-size",
        str(spec.block_size),
        "--settle-timeout-s",
        str(min(spec.timeouts.request_s, spec.timeouts.variant_s / 4)),
        "--settle",
        *mds,
    ]


def _killers(tb, runtime: deploy.Runtime, loadgen: subprocess.Popen) -> dict:
    """What each fault target's SIGKILL is (experiments.spec.faults): the role's process (or container), the load
    generator, the userspace emulator; each returns the PID it killed, None if nothing ran."""

    def kill_loadgen() -> int | None:
        if loadgen.poll() is not None:
            return None
        tb.kill("client", loadgen)
        return loadgen.pid

    targets = [*deploy.START_ORDER, *runtime.workers]  # a role (its first worker) or a worker by name
    killers = {t: (lambda t=t: runtime.kill(t)) for t in targets}
    return {**killers, "loadgen": kill_loadgen, "emulator": tb.kill_emulator}


def _settled(line: str) -> metadata.WarmupSettle:
    """loadgen's `settle ok=1 s=2.50 cached=512/512` line (its format's one home: loadgen.Settled)."""
    s = Settled.parse(line)
    return metadata.WarmupSettle(ok=s.ok, wait_s=s.wait_s, cached_tokens=s.cached, want_tokens=s.want)


class _T0:
    """The load generator's t0 (its `start t0_ns=...` line): the zero of the variant's clock."""

    def __init__(self):
        self.seen = threading.Event()
        self.ns = 0


def _show_progress(proc: subprocess.Popen, variant: str, t0: _T0, window: VariantRecord) -> None:
    """The load generator's output: its warm-up's settle line (into window.warmup_settle), its t0, and its
    `progress DONE/TOTAL failed=F not_issued=N last=ID` lines as a bar on a terminal (plain lines every 10 s
    otherwise: experiments.progress)."""
    bar = None
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if line.startswith("settle "):
                window.warmup_settle = _settled(line)
                how = "in" if window.warmup_settle.ok else "NOT in (settle timeout)"
                log.info(
                    "[%s] warm-up prefix %s the MDs' DRC after %.1f s: %s",
                    variant,
                    how,
                    window.warmup_settle.wait_s,
                    line,
                )
            elif line.startswith("start t0_ns="):
                t0.ns = int(line.split()[1].split("=")[1])
                t0.seen.set()
                log.info("[%s] measured window opens (t0_ns=%d)", variant, t0.ns)
            elif line.startswith("progress "):
                words = line.split()
                done, total = (int(x) for x in words[1].split("/"))
                bar = bar or Progress(f"[{variant}] requests", total, log, unit="req")
                bar.update(done, " ".join(w for w in words[2:4] if not w.endswith("=0")))
            elif line:
                log.debug("[%s] loadgen: %s", variant, line)
    finally:
        if bar is not None:
            bar.close()
