"""The prefix-affinity router (issue 46): each shared prefix on one replica, its hit rate against a
direct LRU simulation of the busiest replica, one replica equal to today's engine, the simulator's
router keeping a prefix where it sent it."""
from __future__ import annotations

import numpy as np
import pytest

from basis.errors import DseError
from dse.core.kv_tiers import TierLoad, lru_outcomes, zipf_popularity
from dse.core.router import PREFIX_AFFINITY, ROUND_ROBIN, _Router, prefix_routed_hits
from dse.core.sessions import Turn
from dse.core.simulator import EngineConfig
from dse.system.evaluator import evaluate
from dse.system.params import ROUTERS


def _tier(count, zipf, slots):
    """A tier of ``slots`` prefixes of 16 tokens (one block) at a byte a token."""
    one = np.ones(1)
    return TierLoad(one, one, 16.0 * slots * one, count * one, zipf * one, np.zeros(1, bool), np.zeros(1, bool))


def test_the_code_follows_the_declared_name():
    assert ROUTERS[PREFIX_AFFINITY] == "prefix-affinity"


@pytest.mark.parametrize("count, zipf, replicas, slots", [(64, 0.8, 4, 5), (200, 1.0, 8, 3), (40, 0.0, 4, 2)])
def test_the_busiest_replicas_hits_match_a_direct_lru_of_its_requests(count, zipf, replicas, slots):
    """Prefix p on replica p mod N: replica 0 gets the requests of prefixes 0, N, 2N, ... (its share
    their popularity's sum); its LRU stack of one device slot and ``slots`` tier slots run on 60,000
    independent Zipf requests' share of it (the first sixth left out): Che's approximation on its
    prefixes, as ``kv_tiers.prefix_hits`` uses it: device and tier together within 0.015, the one
    device slot within 0.06 (Che is rough at one slot with a dominant prefix: at 200 prefixes, Zipf 1,
    8 replicas, 0.426 against 0.483, where one slot's exact hit rate is sum q_i^2 = 0.486)."""
    tier = _tier(count, zipf, slots)
    base = TierLoad(**{**tier.__dict__, "device_hit": np.zeros(1), "tier_hit": np.zeros(1)})
    device, in_tier, share = prefix_routed_hits(base, np.array([16.0]), np.array([16.0]), np.array([replicas]),
                                                np.array([PREFIX_AFFINITY]))
    ids = np.random.default_rng(5).choice(count, size=60000, p=zipf_popularity(count, zipf))
    mine = ids[ids % replicas == 0]
    where = lru_outcomes(mine, 1, slots)[len(mine) // 6:]
    assert share[0] == pytest.approx(len(mine) / len(ids), abs=0.01)
    assert device[0] == pytest.approx(np.mean(where == 0), abs=0.06)
    assert device[0] + in_tier[0] == pytest.approx(np.mean(where <= 1), abs=0.015)


def test_other_routers_and_one_replica_keep_the_whole_populations_hits():
    tier = TierLoad(**{**_tier(64, 0.8, 5).__dict__, "device_hit": np.array([0.3]), "tier_hit": np.array([0.2])})
    for router, n in ((ROUND_ROBIN, 4), (PREFIX_AFFINITY, 1)):
        device, in_tier, share = prefix_routed_hits(tier, np.array([16.0]), np.array([16.0]), np.array([n]),
                                                    np.array([router]))
        assert (device[0], in_tier[0], share[0]) == (0.3, 0.2, 1.0 / n)


def test_one_replica_behind_prefix_affinity_is_todays_engine():
    point = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "weights": "fp8", "activations": "fp8", "kv": "fp8",
             "prompt_len": 2048, "gen_len": 128, "prefix_hit": 0.75, "prefix_count": 8, "request_rate": 5.0}
    one, two = evaluate(point), evaluate({**point, "router": "prefix-affinity"})
    for k in ("ttft_s", "tpot_s", "requests_per_s"):
        assert one[k][0] == two[k][0], k


def test_the_simulators_router_keeps_each_prefix_on_its_replica():
    """Four prefixes, four replicas, one device slot each: prefix affinity misses once per replica
    (its first request) and then always hits; round-robin, every replica seeing all four in turn
    (prefix i at request i: replica i mod 4 always sees the same one) hits too, but a shuffled order
    misses where the replica's last prefix differs."""
    engine = EngineConfig(kv_blocks=1000, kv_block=16, prefix_tokens=64, prefix_count=4, prefix_zipf=0.0)
    order = np.random.default_rng(2).integers(0, 4, 400)
    for kind, misses in ((PREFIX_AFFINITY, 4), (ROUND_ROBIN, None)):
        router = _Router(kind, engine, 4)
        instances = [type("I", (), {"engine": type("E", (), {"load": 0})()})() for _ in range(4)]
        turns = [Turn(i, 0.0, 100, 1, 100, engine.cached_tokens(100), prefix=int(p)) for i, p in enumerate(order)]
        sent = [router(instances, t) for t in turns]
        missed = sum(t.done_prompt == 0 for t in turns)
        if misses is not None:
            assert sent == [int(p) % 4 for p in order] and missed == misses
        else:
            assert missed > 200                  # a random prefix after another: 3 in 4 miss


def test_prefix_affinity_needs_several_prefixes():
    with pytest.raises(DseError, match="prefix_count"):
        evaluate({"model": "llama-3.1-8b", "hardware": "h100-sxm", "request_rate": 4.0, "router": "prefix-affinity",
                  "router_replicas": 2})
