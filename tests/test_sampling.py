"""The sampler draws from the right distribution, honours top-k / top-p, and is keyed per sample."""

import numpy as np
import pytest

from verl_infsample.engines.sampling import SamplingParams, sample_stream, sample_token

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03]))


def _freq(params, draws=20000):
    rng = sample_stream(0, "p", 0)
    counts = np.bincount([sample_token(LOGITS, params, rng)[0] for _ in range(draws)], minlength=len(LOGITS))
    return counts / draws


def test_samples_follow_the_softmax():
    np.testing.assert_allclose(_freq(SamplingParams()), [0.5, 0.25, 0.15, 0.07, 0.03], atol=0.012)


def test_temperature_sharpens():
    f = _freq(SamplingParams(temperature=0.5))
    p = np.exp(2 * LOGITS)
    np.testing.assert_allclose(f, p / p.sum(), atol=0.012)


def test_top_k_and_top_p_renormalise():
    f = _freq(SamplingParams(top_k=2))
    np.testing.assert_allclose(f, [2 / 3, 1 / 3, 0, 0, 0], atol=0.012)
    f = _freq(SamplingParams(top_p=0.8))  # smallest prefix with mass >= 0.8: 0.5 + 0.25 + 0.15
    np.testing.assert_allclose(f, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0], atol=0.012)


def test_min_p_keeps_the_tokens_within_its_share_of_the_most_likely():
    f = _freq(SamplingParams(min_p=0.4))  # p >= 0.4 x 0.5: the first two
    np.testing.assert_allclose(f, [2 / 3, 1 / 3, 0, 0, 0], atol=0.012)
    f = _freq(SamplingParams(min_p=0.25, temperature=2.0))  # at T=2, p ~ sqrt(p): keeps p >= 0.25 x max
    p = np.sqrt([0.5, 0.25, 0.15, 0.07, 0.03])
    p = np.where(p >= 0.25 * p.max(), p, 0)
    np.testing.assert_allclose(f, p / p.sum(), atol=0.012)


@pytest.mark.parametrize("key, value, says", [("min_p", 1.5, "min_p must be in"), ("min_tokens", 200, "min_tokens must"),
                                              ("repetition_penalty", 0.0, "repetition_penalty must be > 0"),
                                              ("presence_penalty", 2.5, "presence_penalty must be in"),
                                              ("frequency_penalty", -3.0, "frequency_penalty must be in")])
def test_bad_values_are_refused_by_name(key, value, says):
    with pytest.raises(ValueError, match=says):
        SamplingParams(**{key: value})


def test_greedy_and_logprob():
    token, logprob = sample_token(LOGITS, SamplingParams(temperature=0), sample_stream(0, "p", 0))
    assert token == 0 and logprob == pytest.approx(np.log(0.5))
    token, logprob = sample_token(LOGITS, SamplingParams(), sample_stream(3, "p", 1))
    assert logprob == pytest.approx(LOGITS[token])


def test_streams_are_keyed_by_seed_prompt_and_index():
    def draw(*key):
        rng = sample_stream(*key)
        return [sample_token(LOGITS, SamplingParams(), rng)[0] for _ in range(40)]

    assert draw(1, "a", 0) == draw(1, "a", 0)
    assert len({tuple(draw(*k)) for k in [(1, "a", 0), (2, "a", 0), (1, "b", 0), (1, "a", 1)]}) == 4


def test_a_last_bit_perturbation_almost_never_changes_the_token():
    rng_a, rng_b = sample_stream(5, "p", 0), sample_stream(5, "p", 0)
    gen = np.random.default_rng(0)
    flips = 0
    for _ in range(3000):
        logits = gen.normal(size=200) * 3
        noisy = logits + gen.normal(size=200) * 1e-6
        flips += sample_token(logits, SamplingParams(), rng_a)[0] != sample_token(noisy, SamplingParams(), rng_b)[0]
    assert flips == 0


def test_distribution_stats_from_the_log_probs_sampling_drew_from():
    """Entropy and stop mass of the distribution a token was drawn from (after the eos bias and temperature), from the
    log-probs ``sample_tokens`` returns: a uniform row has entropy log V; the stop mass adds up the stop tokens."""
    from verl_infsample.engines.sampling import distribution_stats, sample_tokens

    logits = np.array([[0.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, -50.0]])
    params = SamplingParams(temperature=1.0, seed=0, stop_token_ids=(2, 3), logit_bias=((2, np.log(3.0)),))
    rngs = [sample_stream(0, "p", i) for i in range(2)]
    tokens, logprobs, logp = sample_tokens(logits, params, rngs, with_logp=True)
    assert np.allclose(np.exp(logp).sum(axis=1), 1.0)
    assert np.allclose(logprobs, logp[np.arange(2), tokens])
    entropy, stop = distribution_stats(logp, params.stop_token_ids)
    p0 = np.array([1, 1, 3, 1]) / 6  # the eos bias of log 3 on token 2
    assert entropy[0] == pytest.approx(-(p0 * np.log(p0)).sum())
    assert stop[0] == pytest.approx(np.log(4 / 6))
    p1 = np.exp(logp[1])
    assert stop[1] == pytest.approx(np.log(p1[2] + p1[3]))
    assert distribution_stats(logp, ())[1].tolist() == [-np.inf, -np.inf]


# --- the device sampler (torch_sampling): the same rules on the model's device, counter-based noise ---------------
def _splitmix64_reference(z: int) -> int:
    """splitmix64's finaliser in plain Python integers, modulo 2^64: what the int64 tensors must compute."""
    m = (1 << 64) - 1
    z &= m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_device_noise_is_splitmix64_of_key_position_and_token():
    import torch

    from verl_infsample.engines.torch_sampling import CounterStream, uniforms

    golden, m = 0x9E3779B97F4A7C15, (1 << 64) - 1
    streams = [CounterStream(-(1 << 63) + 5, 0), CounterStream(123456789, 7), CounterStream((1 << 63) - 1, 1 << 40)]
    got = uniforms(streams, 50, "cpu")
    for row, s in enumerate(streams):
        base = _splitmix64_reference(s.key + s.t * golden)
        for v in (0, 1, 17, 49):
            bits = _splitmix64_reference((base + (v + 1) * golden) & m) >> 11
            assert got[row, v].item() == (bits + 0.5) * 2.0 ** -53
    assert got.dtype == torch.float64 and 0 < got.min() and got.max() < 1


def test_device_sampler_draws_from_the_distribution_and_matches_the_host_rules():
    """Frequencies follow the probabilities; greedy, top-k and top-p keep what the numpy sampler keeps; a row's
    token does not depend on the other rows; each draw advances its stream by one token."""
    import torch

    from verl_infsample.engines import sampling, torch_sampling as ts

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0], dtype=torch.float32)
    p = torch.softmax(logits.double(), 0).numpy()
    streams = [ts.counter_stream(3, "p", i) for i in range(4000)]
    tokens, logprobs, _ = ts.sample_shared(logits, SamplingParams(), streams)
    freq = np.bincount(tokens, minlength=6) / len(tokens)
    assert np.abs(freq - p).max() < 0.03 and all(s.t == 1 for s in streams)
    np.testing.assert_allclose(logprobs, np.log(p[tokens]), rtol=0, atol=1e-12)
    rows = torch.randn(5, 40)
    for params in (SamplingParams(temperature=0), SamplingParams(top_k=3), SamplingParams(top_p=0.7),
                   SamplingParams(temperature=0.5, logit_bias=((2, 4.0),)), SamplingParams(min_p=0.2),
                   SamplingParams(temperature=1.5, top_k=10, min_p=0.1)):
        host_logp, host_keep = sampling._distribution(rows.numpy(), params)
        dev_logp, dev_keep = ts.distribution(rows, params)
        np.testing.assert_allclose(dev_logp.numpy(), host_logp, rtol=0, atol=1e-12)
        assert (dev_keep is None) == (host_keep is None)
        if host_keep is not None:
            assert (dev_keep.numpy() == host_keep).all()
        batch = [ts.counter_stream(9, "q", i) for i in range(5)]
        together, _ = ts.sample_tokens(rows, params, batch)
        alone = [ts.sample_tokens(rows[i:i + 1], params, [ts.counter_stream(9, "q", i)])[0][0] for i in range(5)]
        assert together.tolist() == alone and all(s.t == 1 for s in batch)
        if host_keep is not None:
            assert host_keep[np.arange(5), together].all()  # never a token top-k / top-p / min-p dropped
        else:
            assert together.tolist() == rows.argmax(1).tolist()


# --- penalties: vLLM's history rules, before either sampler ---------------------------------------------------------
@pytest.mark.parametrize("params", [
    SamplingParams(repetition_penalty=1.7), SamplingParams(repetition_penalty=0.6),
    SamplingParams(presence_penalty=1.5), SamplingParams(frequency_penalty=-0.5),
    SamplingParams(min_tokens=3, stop_token_ids=(0, 4)),
    SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((5, 2.0),),
                   min_tokens=2, stop_token_ids=(1,))])
def test_penalties_follow_vllms_rules_row_by_row(params, vllm_logit_rules):
    import torch

    from verl_infsample.engines.penalties import apply_penalties, sampler_params

    gen = np.random.default_rng(0)
    logits = torch.tensor(gen.normal(size=(4, 12)) * 2, dtype=torch.float32)
    prompts = [torch.tensor([3, 5, 5]), torch.tensor([7]), torch.tensor([2, 9, 11, 3]), torch.tensor([0])]
    responses = [[], [5, 5, 8], [1, 2, 3, 3, 3], [6, 4]]
    got = apply_penalties(logits, params, prompts, responses)
    assert got is not logits and got.dtype == torch.float32
    for b in range(4):
        want = vllm_logit_rules(logits[b].numpy(), params, prompts[b].tolist(), responses[b])
        np.testing.assert_allclose(got[b].numpy(), want, rtol=1e-6, atol=1e-6)
    # a row's result does not depend on the other rows (schedule invariance)
    alone = apply_penalties(logits[2:3], params, prompts[2:3], responses[2:3])
    assert torch.equal(alone[0], got[2])
    assert sampler_params(params).logit_bias == ()  # the bias is added once, here


def test_no_history_rules_leave_the_logits_to_the_sampler():
    import torch

    from verl_infsample.engines.penalties import apply_penalties, sampler_params

    logits = torch.zeros(2, 5)
    params = SamplingParams(logit_bias=((1, 3.0),), stop_token_ids=(2,))
    assert apply_penalties(logits, params, [torch.tensor([1])] * 2, [[1], []]) is logits
    assert sampler_params(params) is params and not params.reads_history
