"""The run directory's typed records: metadata.json (experiments.rundir.metadata) and client.jsonl
(experiments.rundir.clientlog) written and read back whole; a missing or wrong field is an error naming the file
and the field; older layouts still read."""

import json

import pytest

from experiments.analysis import analyze
from experiments.rundir import clientlog, metadata
from experiments.rundir.clientlog import ClientLogError, ClientRecord, Done, TokenRow
from experiments.rundir.metadata import MetadataError, RunMetadata, VariantRecord
from fake_run import PROVENANCE, topology_record


def full_metadata() -> RunMetadata:
    """A serving run's metadata with every section a run of today writes."""
    meta = RunMetadata(
        experiment="pdd-smoke",
        complete=False,
        provenance=PROVENANCE,
        spec={"variants": ["pdd"], "model": "tiny", "weights_seed": 0, "profile": "wan-flaky", "slo": {}, "x": 1},
        seeds={"workload": 3, "weights": 0, "topology": 1},
        runtime="process",
        workload={"requests": 9},
        topology=topology_record(),
        shared_topology={"id": 1, "runs_before": 2, "start_s": 1.5},
    )
    meta.variants["pdd"] = w = VariantRecord(
        status="running", wall_start=1000.0, t_start_ns=5, t_ready_ns=2_000_000_005
    )
    w.link_changes = [{"t_ns": 7, "offset_s": 0.1, "direction": "a_to_b", "params": {"loss_pct": 1}, "cause": "spec"}]
    w.cross_traffic = [
        {
            "name": "bulk",
            "kind": "tcp",
            "direction": "b_to_a",
            "start_ns": 8,
            "end_ns": None,
            "port": 5301,
            "iperf_json": "variants/pdd/cross/bulk-b_to_a.json",
            "streams": 2,
            "congestion": "bbr",
            "rate_mbit": None,
        }
    ]
    health = {"frames": 10, "p50_us": 20.0, "p99_us": 60.0, "max_us": 90.0, "rx_drops": 1, "tx_errors": 0}
    w.emulator = {"a_to_b": health, "b_to_a": health, "cpu_share": 0.2, "late": False}
    w.faults = [{"kill": "md", "at_s": 2.0, "played": True, "pid": 42, "t_ns": 9, "offset_s": 2.0}]
    w.exit_codes, w.t_end_ns, w.status = {"router": 0, "md": -9}, 3_000_000_005, "ok"
    meta.complete, meta.finished_at = True, "2026-12-01T09:10:00+0000"
    return meta


def test_metadata_round_trip(tmp_path):
    meta = full_metadata()
    metadata.write(tmp_path, meta)
    back = metadata.read(tmp_path)
    assert back.model_dump() == meta.model_dump() and back.spec.model_extra == {"x": 1}  # the spec kept whole
    w = back.variants["pdd"]
    assert (w.role_start_s, w.measured_s, w.emulator.dropped()) == (2.0, 1.0, 2)
    on_disk = json.loads((tmp_path / "metadata.json").read_text())
    [fault] = on_disk["variants"]["pdd"]["faults"]
    assert "error" not in fault and "after" not in fault  # a fault's key is there only when it was recorded


def test_a_missing_field_names_the_file_and_the_field(tmp_path):
    data = full_metadata().model_dump(mode="json")
    del data["variants"]["pdd"]["status"]
    data["complete"] = "maybe"
    (tmp_path / "metadata.json").write_text(json.dumps(data))
    with pytest.raises(MetadataError) as err:
        metadata.read(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'metadata.json'}: ")
    assert "complete: Input should be a valid boolean" in str(err.value)
    assert "variants.pdd.status: Field required" in str(err.value)


def test_not_a_run_directory_and_not_json(tmp_path):
    with pytest.raises(MetadataError, match="no metadata.json"):
        metadata.read(tmp_path)
    (tmp_path / "metadata.json").write_text('{"experiment": ')
    with pytest.raises(MetadataError, match="metadata.json: not JSON"):
        metadata.read(tmp_path)


def test_a_writer_cannot_set_a_wrong_value():
    w = VariantRecord(status="running")
    with pytest.raises(ValueError, match="status"):
        w.status = "done"
    with pytest.raises(ValueError, match="wall_start"):
        w.wall_start = "now"


def test_analysis_needs_the_spec_and_says_so(tmp_path):
    """A calibration's directory (no spec) given to the analysis: an error naming the missing section."""
    meta = RunMetadata(experiment="link-calibration", complete=True, provenance=PROVENANCE, seeds={"topology": 1})
    metadata.write(tmp_path, meta)
    (tmp_path / "variants").mkdir()
    with pytest.raises(analyze.AnalysisError, match=r"metadata.json: no `spec` section \(experiment 'link-calib"):
        analyze.analyze(tmp_path)


def test_an_older_calibration_reads_its_top_level_provenance(tmp_path):
    old = {"experiment": "link-calibration", "complete": True, "calibration": {"udp": True}, **PROVENANCE}
    (tmp_path / "metadata.json").write_text(json.dumps(old))
    meta = metadata.read(tmp_path)
    assert meta.provenance.started_at == PROVENANCE["started_at"] and meta.calibration == {"udp": True}
    assert meta.spec is None and meta.variants == {}


def client_record(**changes) -> ClientRecord:
    rec = clientlog.new_record("r1", "pdd", "pdd", "s01", 2, "agent", 3, [5, 6, 7], 100)
    rec.tokens = [TokenRow(1, 9, "md1", 30, 29), TokenRow(0, 8, "p1", 20, 19)]
    rec.done = Done(route="p-rld-md", finish_reason="length", duplicates=0, md_cached_tokens=16, notes=[])
    rec.t_done_ns = rec.t_send_ns + 50
    return rec.model_copy(update=changes)


def test_client_record_round_trip(tmp_path):
    recs = [client_record(), client_record(request_id="r2", error="UNAVAILABLE: gone", done=None, tokens=[])]
    path = tmp_path / "client.jsonl"
    path.write_text("".join(clientlog.line(r) for r in recs))
    back = clientlog.read(path)
    assert back == recs and back[0].reply() == [8, 9] and back[0].router_id == "pdd.r1"
    assert json.loads(path.read_text().splitlines()[0])["tokens"][0] == [1, 9, "md1", 30, 29]  # a row on disk


def test_a_client_record_missing_a_field_names_file_line_and_field(tmp_path):
    path = tmp_path / "client.jsonl"
    bad = client_record().model_dump(mode="json")
    del bad["t_send_ns"]
    path.write_text(clientlog.line(client_record()) + json.dumps(bad) + "\n")
    with pytest.raises(ClientLogError, match=rf"{path}:2: t_send_ns: Field required"):
        clientlog.read(path)


def test_a_torn_last_line_is_left_out_and_a_torn_middle_line_is_not(tmp_path):
    path = tmp_path / "client.jsonl"
    good = clientlog.line(client_record())
    path.write_text(good + good[:40])
    assert len(clientlog.read(path)) == 1
    path.write_text(good[:40] + "\n" + good)
    with pytest.raises(ClientLogError, match=rf"{path}:1: not JSON"):
        clientlog.read(path)


def test_an_older_client_record_without_its_mode_ran_its_variant(tmp_path):
    old = client_record().model_dump(mode="json")
    del old["mode"], old["prompt"], old["prompt_sha1"], old["t0_ns"]
    path = tmp_path / "client.jsonl"
    path.write_text(json.dumps(old) + "\n")
    [rec] = clientlog.read(path)
    assert rec.mode == "pdd" and rec.prompt is None and rec.reply() == [8, 9]


def test_provenance_records_the_machine_and_the_package_versions(tmp_path):
    from experiments.rundir import files

    prov = files.provenance()
    assert prov["machine"]["cores"] >= 1 and len(prov["machine"]["load_average"]) == 3
    assert prov["machine"]["cpu_model"]
    assert prov["packages"]["torch"].startswith("2.13.0") and prov["packages"]["numpy"] and prov["packages"]["grpcio"]
    metadata.write(tmp_path, RunMetadata(experiment="x", complete=True, provenance=prov))
    back = metadata.read(tmp_path).provenance
    assert back.machine.cores == prov["machine"]["cores"] and back.packages == prov["packages"]


def test_the_machines_reference_speed_is_measured_and_recorded(tmp_path):
    from experiments.rundir import files

    prov = files.provenance(speed=True)
    speed = prov["machine"]["speed"]
    # a 256-token prefill is compute-bound and many times a one-token pass, which streams the weights once
    assert speed["prefill_cpu_ms"] > 4 * speed["decode_cpu_ms"] > 0 and speed["rounds"] == 3
    assert speed["prefill_wall_ms"] >= 0.9 * speed["prefill_cpu_ms"]  # wall time holds the thread's CPU time
    metadata.write(tmp_path, RunMetadata(experiment="x", complete=True, provenance=prov, speed_at_end=speed))
    back = metadata.read(tmp_path)
    assert back.provenance.machine.speed.prefill_cpu_ms == speed["prefill_cpu_ms"]
    assert back.speed_at_end.decode_wall_ms == speed["decode_wall_ms"]
    assert "speed" not in files.provenance()["machine"]  # only a run measures it (~2 s)


def speed_record(prefill_cpu_ms):
    return {
        "work": "w",
        "rounds": 3,
        "prefill_wall_ms": prefill_cpu_ms,
        "prefill_cpu_ms": prefill_cpu_ms,
        "decode_wall_ms": 14.0,
        "decode_cpu_ms": 14.0,
        "load_average": [0.5, 0.5, 0.5],
    }


def test_a_machine_that_changed_during_the_run_is_warned_of():
    from experiments.analysis.analyze import machine_speed
    from experiments.analysis.summary_md import machine_words

    def meta(start, end):
        machine = {"cpu_model": "c", "cores": 2, "load_average": [0.5] * 3, "speed": start and speed_record(start)}
        prov = {"git": {"commit": None, "dirty": None}, "kernel": "k", "python": "3", "hostname": "h", "argv": []}
        prov |= {"tools": {}, "machine": machine, "started_at": "t"}
        return RunMetadata(experiment="x", complete=True, provenance=prov, speed_at_end=end and speed_record(end))

    machine, warned = machine_speed(meta(220.0, 260.0))
    assert machine["start"]["prefill_cpu_ms"] == 220.0 and machine["end"]["prefill_cpu_ms"] == 260.0
    [w] = warned
    assert w["kind"] == "machine_speed_changed" and "220 ms" in w["message"] and "1.18x" in w["message"]
    assert machine_speed(meta(220.0, 235.0))[1] == []  # within 10%
    assert machine_speed(meta(None, None)) == (None, [])  # a run made before it was recorded
    assert machine_speed(meta(220.0, None))[0]["end"] is None  # an interrupted run: the start's alone
    assert machine_words(machine) == [
        "",
        "machine's reference prefill (CPU time; docs/outputs.md): before 220 ms (load 0.5), after 260 ms (load 0.5)",
    ]
