"""A burst of prompts larger than P's KV cache all completes, through real role processes on loopback.

Issue 28: aiperf's 48 concurrent streams against `pddlab serve` lost 162 of 192 requests to P's
RESOURCE_EXHAUSTED ("only 10 of 1024 can be freed now"). Here P's cache holds 8 blocks of 16 tokens, one
100-token prompt (7 blocks) at a time, and six pd-intra requests arrive at once: P queues them until earlier
prompts free their blocks. The deployment: tests/e2e/pdd_harness.py (router, P, RLD, MD as processes).
The in-process cases (bound, deadline, too big, order): tests/roles/test_prefill_room.py.
"""

import sys
import threading
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the deployment harness

from pdd_harness import Deployment  # noqa: E402
from test_roles import check_reference, check_stream, events_of, fresh_prompt  # noqa: E402
from workers.engine import Engine, GenerationRequest  # noqa: E402
from workers.roles.client import generate  # noqa: E402
from workers.roles.config import load_config  # noqa: E402

PROMPT, OUT, BURST = 100, 8, 6
P_CAPACITY = 8 * 16  # one prompt (100 + 1 tokens: 7 blocks) at a time


@pytest.fixture
def dep(tmp_path):
    d = Deployment(tmp_path)
    data = yaml.safe_load(d.config_path.read_text())
    data["p"][0]["capacity_tokens"] = P_CAPACITY
    d.config_path.write_text(yaml.safe_dump(data))
    d.cfg = load_config(d.config_path)
    try:
        yield d.start()
    finally:
        d.stop()


def _reference():
    engine = Engine("tiny", seed=0, capacity_tokens=4096, block_size=16, device="cpu", prefix_cache=False)

    def ref(prompt: list[int], max_tokens: int) -> list[int]:
        return list(engine.generate(GenerationRequest("ref", tuple(prompt), max_tokens)).output_tokens)

    ref.engine = engine
    return ref


@pytest.mark.slow
def test_a_burst_larger_than_ps_cache_all_completes(dep):
    prompts = {f"burst-{i}": fresh_prompt(PROMPT) for i in range(BURST)}
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
    reference = _reference()
    for rid, gen in gens.items():
        check_stream(gen, OUT)
        check_reference(reference, prompts[rid], gen.ids, OUT, rid)
    waited = [gen.done.request_id for gen in gens.values()]
    waited = [rid for rid in waited if events_of(dep, "p1", rid, "kv_room_wait")]
    assert waited, "the burst did not overlap on P: nothing queued"
