"""An RLD whose KV cache is full for now queues a session until room comes back, with the KV from P waiting in
host memory meanwhile: two pd-intra requests at once on an RLD that holds one of them both complete with the
colocated reference's tokens. Roles as processes on loopback (the in-process case: tests/roles/test_room_wait.py).
"""

import threading

import pytest
import yaml

from pdd_harness import Deployment
from test_roles import check_reference, check_stream, events_of, fresh_prompt
from workers.roles.client import generate
from workers.roles.config import load_config

PROMPT, OUT = 60, 60  # 120 tokens: 8 blocks of 16
RLD_CAPACITY = 12 * 16  # room for one such session, not two


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("kv-room"))
    data = yaml.safe_load(d.config_path.read_text())
    data["rld"][0]["capacity_tokens"] = RLD_CAPACITY
    d.config_path.write_text(yaml.safe_dump(data))
    d.cfg = load_config(d.config_path)
    try:
        yield d.start()
    finally:
        d.stop()


def test_a_full_rld_queues_the_second_session_and_both_complete(dep, reference):
    prompts = {f"room-{i}": fresh_prompt(PROMPT) for i in range(2)}
    gens, errors = {}, []

    def one(rid: str) -> None:
        try:
            gens[rid] = generate(dep.channel, prompts[rid], OUT, mode="pd-intra", request_id=rid)
        except Exception as err:  # noqa: BLE001 - reported below with the request
            errors.append(f"{rid}: {err}")

    threads = [threading.Thread(target=one, args=(rid,)) for rid in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for rid, gen in gens.items():
        check_stream(gen, OUT)
        check_reference(reference, prompts[rid], gen.ids, OUT, rid)
    rids = [gen.done.request_id for gen in gens.values()]
    waited = [rid for rid in rids if events_of(dep, "rld1", rid, "kv_room_wait")]
    assert len(waited) == 1, "the two sessions did not overlap on the RLD"
    [ready] = events_of(dep, "rld1", waited[0], "kv_room_ready")
    assert ready.fields["wait_ns"] > 0
