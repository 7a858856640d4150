"""Drafts keep the sampled law: vLLM's rejection sampler verifies draft tokens so that what is sampled is the
model's distribution, at temperature 1, with top-p and with top-k alone. On the CPU that holds only with the sampler
fixes (``patches/vllm_cpu_sampler_*.py``); without it the same samples move by many standard errors.

Many samples of the tiny model per prompt, drafts (the plugin's ``GroupDrafter``) on and off, seeded per request (each
run its own seeds, so the two samples are independent, and the same on every run); each sample's length and mean
log-probability per token are compared between the two by a two-sample z-test. The same runs check that greedy
decoding gives the same tokens with drafts on and off, that vLLM's log-probs match transformers' recomputation as
closely with drafts as without, and that the drafter's run-time law check (``drafter.law_guard``) stays quiet on the
fixed sampler and raises its alarm on the flawed one."""

import pytest

from infsample_lab.bench.sampled_law import Z_LIMIT, sample, z_scores
from verl_infsample.drafter.law_guard import LawTally

SAMPLES = 120  # per prompt and setting
# the flawed sampler moves the law by some 15-20 standard errors at SAMPLES (and the run-time check's z by 20-35):
# a third of them still shows it several times over the limits
UNFIXED_SAMPLES = SAMPLES // 3


def _sample(model_dir: str, drafts: str, plugins: bool = True, seed: int = 0, samples: int = SAMPLES) -> dict:
    return sample(model_dir, drafts, samples, plugins=plugins, seed=seed)


@pytest.fixture(scope="module")
def no_drafts(tiny_model_dir):
    return _sample(tiny_model_dir, "none")


@pytest.mark.integration
def test_drafts_sample_the_models_law_at_temperature_1_top_p_and_top_k(tiny_model_dir, no_drafts):
    drafted = _sample(tiny_model_dir, "group", seed=1)  # a draw of its own: two independent samples
    assert drafted["accepted"] > 0.1 * drafted["drafted"] > 0  # drafts were proposed, and many accepted
    z = z_scores(drafted, no_drafts)
    law = LawTally(**drafted["drafter"]["law"])
    print(f"drafts on vs off, patched sampler: max |z| {max(abs(v) for v in z.values()):.2f}; accepted "
          f"{drafted['accepted']} of {drafted['drafted']} drafted; run-time check z {law.z:.2f} over {law.tested}; "
          f"log-prob gap to transformers {drafted['logprob_gap']:.2e} (no drafts {no_drafts['logprob_gap']:.2e})")
    assert max(abs(v) for v in z.values()) < Z_LIMIT, z
    assert drafted["greedy"] == no_drafts["greedy"]
    assert drafted["logprob_gap"] < 1e-4 and no_drafts["logprob_gap"] < 1e-4
    assert law.tested > 500 and not law.alarm, law
    assert drafted["drafter"]["drafted"] == drafted["drafted"]  # the drafter reads the sampler's own verdicts


@pytest.mark.integration
def test_without_the_sampler_fix_the_same_test_fails(tiny_model_dir, no_drafts):
    """The test has the power to see the flaw: vLLM's CPU sampler without the expand fix (no plugin loaded) moves the
    law."""
    unfixed = _sample(tiny_model_dir, "group", plugins=False, seed=1, samples=UNFIXED_SAMPLES)
    z = z_scores(unfixed, no_drafts)
    law = LawTally(**unfixed["drafter"]["law"])
    print(f"drafts on vs off, vLLM's CPU sampler as shipped: max |z| {max(abs(v) for v in z.values()):.2f}; "
          f"run-time check z {law.z:.2f}, gap {law.gap:.3f}")
    assert max(abs(v) for v in z.values()) > Z_LIMIT, z
    assert law.alarm and law.gap > 0, law  # the run-time check sees it too, from inside the run
