"""The input/output cost split of a served engine (dse/system/served.py ``prefill_time_share``): each
request's prompt priced once as the time it adds to an iteration of the engine's decoders, the rule
``_serving_energy`` prices energy by, against hand calculations on closed-form iteration pricers: an
affine (dense) one and a mixture whose expert reads grow concavely with the tokens."""
from types import SimpleNamespace

import numpy as np
import pytest

from dse.system.served import prefill_time_share

PROMPT, GEN = 512.0, 128.0
LOAD = SimpleNamespace(lengths=SimpleNamespace(mean_prompt=PROMPT, mean_gen=GEN))
OUT = {"running_batch": np.array([8.0, 24.0]), "tpot_s": np.array([0.010, 0.014]),
       "requests_per_s": np.array([3.0, 9.0])}


def test_dense_share_is_the_prompt_tokens_marginal_time():
    a, per_token, per_ctx = 4e-3, 2e-5, 1e-9        # fixed s, s a token, s a context token

    def affine(d, dctx, c, pctx, seqs, rows):
        return a + per_token * (d + c) + per_ctx * (dctx + pctx)
    share = prefill_time_share(OUT, LOAD, affine)
    b, tpot, rps = OUT["running_batch"], OUT["tpot_s"], OUT["requests_per_s"]
    # by hand: a prompt adds its tokens and its attention over half of itself to a decoders' iteration
    pre = rps * (per_token * PROMPT + per_ctx * PROMPT * PROMPT / 2)
    dec = (a + per_token * b + per_ctx * b * (PROMPT + GEN / 2)) / tpot
    assert share == pytest.approx(pre / (pre + dec), rel=1e-9)


def test_mixture_share_charges_a_prompt_only_the_experts_it_adds():
    experts, active, weights_s = 64, 4, 2e-4        # one expert's read, s

    def mixture(d, dctx, c, pctx, seqs, rows):      # experts read: E (1 - (1 - k/E)^tokens), concave
        tokens = np.asarray(d, dtype=float) + c
        read = experts * (1 - (1 - active / experts) ** tokens)
        return 1e-3 + weights_s * read + 1e-5 * tokens
    share = prefill_time_share(OUT, LOAD, mixture)
    b, tpot, rps = OUT["running_batch"], OUT["tpot_s"], OUT["requests_per_s"]
    decode_read = experts * (1 - (1 - active / experts) ** b)
    # a 512-token prompt reads every expert: it adds the experts the decoders left unread
    pre = rps * (weights_s * (experts - decode_read) + 1e-5 * PROMPT)
    dec = (1e-3 + weights_s * decode_read + 1e-5 * b) / tpot
    assert share == pytest.approx(pre / (pre + dec), rel=1e-6)
    # the mean iteration's prompt share (rps x tpot prompts, priced alone) reads every expert each TPOT
    arrivals = rps * tpot
    alone = mixture(0, 0, arrivals * PROMPT, 0, arrivals, None)
    assert np.all(share < alone / (alone + mixture(b, 0, 0, 0, 0, None)))


def test_disaggregated_share_is_the_prefill_pools():
    assert prefill_time_share(OUT, LOAD, None, np.array([0.25, 0.5])) == pytest.approx([0.25, 0.5])
