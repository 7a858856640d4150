"""Drafts in the replay: the product's drafters propose for vLLM's scheduler, which verifies against each sample's
recorded tokens; the synthetic drafter's acceptance; the cost model's host and proposer time; traces from text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl_infsample.cli import main as cli
from verl_infsample.core.text_groups import PromptGroup, trace_from_groups
from verl_infsample.core.trace import read_trace, write_trace
from infsample_lab.replay.drafts import DraftSetup
from infsample_lab.replay.hardware import GPUS, MODELS, Calibration, StepCostModel
from infsample_lab.replay.vllm_replica import ReplayRequest, ReplicaReplay, ReplicaSetup, model_config_dir

QWEN8 = MODELS["qwen3-8b"]


def _groups(prompts: int = 6, group: int = 6, seed: int = 0) -> list[PromptGroup]:
    """Siblings that share most of an answer (a template, a few words changed): what drafts feed on."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(prompts):
        template = rng.integers(10, 400, 120)
        responses = []
        for _ in range(group):
            r = template.copy()
            changed = rng.random(len(r)) < 0.05
            r[changed] = rng.integers(10, 400, int(changed.sum()))
            responses.append(r[:int(rng.integers(40, 120))].tolist())
        out.append(PromptGroup(f"p{g}", rng.integers(400, 500, 20).tolist(), responses))
    return out


def _run(requests, spec: DraftSetup | None, seqs: int = 8, cost=True, blocks: int = 400, batched: int = 512):
    setup = ReplicaSetup(num_blocks=blocks, max_num_seqs=seqs, max_model_len=512, max_num_batched_tokens=batched)
    model = StepCostModel(GPUS["h200"], QWEN8) if cost else None
    return ReplicaReplay(model_config_dir(QWEN8), setup, model, QWEN8.vocab, drafts=spec).run(requests)


def _hints(group: str | None) -> dict:
    """A request's arrival as its server tells the drafter of it, in ``group`` (nothing: plain vLLM)."""
    from verl_infsample.drafter.hints import SampleArrival

    return {"arrival": SampleArrival(group, 3, 3)} if group is not None else {}


def _requests(groups, group_hint=False) -> list[ReplayRequest]:
    return [ReplayRequest(f"{g.prompt_id}-{j}", tuple(g.prompt), len(r), tokens=tuple(r),
                          **_hints(g.prompt_id if group_hint else None))
            for g in groups for j, r in enumerate(g.responses)]


@pytest.mark.parametrize("method", ["suffix", "group", "group_gpu"])  # ngram reads only the sample's own text: below
def test_drafts_verified_against_the_recorded_tokens_answer_every_sample_in_fewer_steps(method):
    requests = _requests(_groups(), group_hint=method.startswith("group"))
    off = _run(requests, None)
    on = _run(requests, DraftSetup(method, tokens=4))
    lengths = sorted((r.request_id, r.length) for r in requests)
    assert sorted(off.finished) == sorted(on.finished) == lengths  # every sample once, at its length
    assert on.output_tokens == off.output_tokens == sum(r.length for r in requests)
    assert 0 < on.accepted <= on.drafted and on.output_tokens == on.decode_rows + on.accepted
    assert on.engine_steps < off.engine_steps and off.propose_s == 0
    assert (on.propose_s > 0) == (method != "group_gpu")  # a device drafter takes no host time
    assert on.proposing_rows <= on.proposer_rows


@pytest.mark.parametrize("method", ["ngram", "suffix", "group", "group_gpu"])
def test_a_draft_is_accepted_only_where_it_equals_the_samples_next_token(method):
    """No drafter sees the future. Four siblings share an opening of 30 tokens, then each goes on with 30 tokens of
    its own; two run at a time. The later two draft their opening from the earlier two's answers (suffix, group;
    ngram reads only the sample's own text) and accept nothing of their own tails, though every sample's recorded
    tokens are in the replay: each tail token takes a step of its own. The same siblings repeating one phrase
    accept almost every draft token."""
    group = "g" if method.startswith("group") else None
    opening = tuple(range(2000, 2030))
    diverging = [ReplayRequest(f"r{i}", (1, 2, 3), 60, tokens=opening + tuple(range(3000 + 30 * i, 3030 + 30 * i)),
                               **_hints(group)) for i in range(4)]
    res = _run(diverging, DraftSetup(method, tokens=4), seqs=2)
    assert res.accepted <= 2 * len(opening) and res.engine_steps >= 2 * 30 + 30 // 5  # each tail token a step
    assert (res.accepted > 0) == (method != "ngram")
    phrase = (5, 6, 7, 8, 9)
    looping = [ReplayRequest(f"r{i}", (1, 2, 3), 60, tokens=phrase * 12, **_hints(group))
               for i in range(4)]
    res = _run(looping, DraftSetup(method, tokens=4))
    assert res.output_tokens / res.decode_rows > 3 and res.engine_steps < 25


@pytest.mark.parametrize("accept", [None, 0.3])
def test_the_oracle_lane_verifies_only_accepted_tokens_and_no_budget_beats_it(accept):
    """``group_oracle``: the group drafter's drafts cut to what verification accepts, on the recorded tokens and on
    synthetic acceptance: nothing it drafts is rejected, it takes no more steps than the budget, and its modeled
    seconds are under the budgeted drafter's, which drafts the same text less well."""
    requests = _requests(_groups(), group_hint=True) if accept is None else \
        [ReplayRequest(f"w{i}", (1, 2, 3), 100) for i in range(64)]
    kwargs = dict(seqs=64, blocks=2000, batched=8192) if accept is not None else {}
    budget, oracle = (_run(requests, DraftSetup(m, tokens=8, accept=accept), **kwargs)
                      for m in ("group", "group_oracle"))
    assert sorted(oracle.finished) == sorted(budget.finished)
    assert 0 < oracle.accepted == oracle.drafted and budget.accepted < budget.drafted
    assert oracle.engine_steps <= budget.engine_steps and oracle.model_s < budget.model_s
    assert 0 < oracle.proposing_rows < oracle.proposer_rows  # charged only where a draft is left
    assert DraftSetup("group_oracle").drafter == "group" and DraftSetup("group_oracle", accept=0.3).label == \
        "group_oracle@0.3"


def test_synthetic_drafts_accept_as_told():
    requests = [ReplayRequest(f"r{i}", (1, 2, 3), 200) for i in range(8)]
    none = _run(requests, DraftSetup("suffix", tokens=4, accept=0.0))
    assert none.accepted == 0 and none.drafted > 0 and none.engine_steps == 200
    every = _run(requests, DraftSetup("suffix", tokens=4, accept=1.0))
    assert every.engine_steps == 40 + 1  # five tokens a step; the first step is the prefill's
    half = _run(requests, DraftSetup("suffix", tokens=4, accept=0.5))
    assert 1.8 < half.output_tokens / half.decode_rows < 2.1  # 1 + 0.5 + 0.25 + 0.125 + 0.0625 = 1.94
    # group's budget: a full batch at low acceptance drafts only the tokens that pay for their GEMMs, not K a row
    wide = [ReplayRequest(f"w{i}", (1, 2, 3), 100) for i in range(128)]
    fixed, budget = (_run(wide, DraftSetup(m, tokens=8, accept=0.3), seqs=128, blocks=2000, batched=8192)
                     for m in ("suffix", "group"))
    assert fixed.preemptions == budget.preemptions == 0
    assert fixed.drafted / fixed.decode_rows > 7 and budget.drafted / budget.decode_rows < 3.5
    assert budget.model_s < fixed.model_s


def test_the_host_time_overlaps_without_drafts_and_adds_with_them():
    cost = StepCostModel(GPUS["h200"], QWEN8, calibration=Calibration(host_step_s=0.001, host_row_s=1e-4,
                                                                       propose_suffix_row_s=2e-4))
    gpu = 0.02
    assert cost.step_seconds(gpu, 100) == gpu  # 0.011 s of host time hidden behind the GPU step
    assert cost.step_seconds(gpu, 400) == pytest.approx(0.041)  # the host is the longer one
    assert cost.step_seconds(gpu, 100, "suffix", 100, 100) == pytest.approx(0.02 + 0.011 + 0.02)
    group = StepCostModel(GPUS["h200"], QWEN8, calibration=Calibration(upkeep_group_row_s=1e-5,
                                                                        propose_group_row_s=1e-4))
    assert group.propose_seconds("group", 100, 10) == pytest.approx(0.001 + 0.001)  # upkeep on all, drafts on ten
    # a device drafter keeps the overlap: its kernel adds to the GPU's time (at least the published share of it,
    # or its reads over the bandwidth), nothing to the host's
    assert group.propose_seconds("group_gpu", 100, 100) == 0
    assert cost.step_seconds(gpu, 100, "group_gpu", 100, 100, device_s=0.001) == pytest.approx(0.021)
    assert cost.step_seconds(gpu, 400, "group_gpu", 400, 400, device_s=0.001) == pytest.approx(0.041)
    assert cost.device_draft_seconds(gpu, 0) == pytest.approx(0.0059 * gpu)
    assert cost.device_draft_seconds(gpu, 10**9) == pytest.approx(4e9 / GPUS["h200"].hbm_bytes_per_s)
    contexts = np.full(300, 1000.0)  # drafts off, the host longer than the GPU: the stretch pays the host's time
    step = cost.step_seconds(cost.seconds(np.ones(300), contexts, 300), 300)
    assert cost.decode_run_seconds(contexts, 1) == pytest.approx(step)


def test_traces_from_text_split_an_earlier_step_and_keep_tokens(tmp_path):
    groups = tmp_path / "g.jsonl"
    groups.write_text("\n".join(json.dumps({"prompt_id": f"q{i}", "prompt": f"say {i}",
                                            "responses": [f"a b {i}", f"a c {i}", "", f"d {i}"]}) for i in range(3)))
    out = tmp_path / "t.jsonl"
    assert cli(["trace", "from-text", "--groups", str(groups), "--history", "1", "--out", str(out)]) == 0
    trace = read_trace(out)
    assert [(p.prompt_id, p.step, p.group_size) for p in trace] == [
        *((f"q{i}", 0, 1) for i in range(3)), *((f"q{i}", 1, 2) for i in range(3))]  # the empty answer dropped
    assert trace[3].tokens[0][:2] == trace[0].tokens[0][:1] + (trace[3].tokens[0][1],)  # "a" has one id
    assert all(len(t) == n for p in trace for t, n in zip(p.tokens, p.lengths))
    assert trace_from_groups(_groups(2, 3), 0)[0].step == 0
    assert cli(["trace", "from-text", "--groups", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert cli(["trace", "from-text", "--groups", str(groups), "--history", "-1", "--out", str(out)]) == 2


def test_replay_with_drafts_end_to_end_and_its_errors(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    write_trace(trace_from_groups(_groups(4, 4), history=1), trace)
    args = ["replay", "--trace", str(trace), "--replicas", "2", "--max-num-seqs", "8", "--num-blocks", "200",
            "--max-num-batched-tokens", "512", "--backend", "vllm,infinite", "--router", "group_affinity", "--json"]
    assert cli([*args, "--spec", "off", "--spec", "group", "--spec-tokens", "4"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["backend"], r["spec"], r["step"]) for r in rows] == [
        (b, s, step) for step in (0, 1) for b in ("vllm", "infinite") for s in ("off", "group")]
    for r in rows:
        assert r["samples"] == (4 if r["step"] == 0 else 12)
        if r["spec"] == "off":
            assert r["tokens_per_step"] == 1.0 and r["drafted_per_step"] == 0 and r["propose_s"] == 0
        else:
            assert r["propose_s"] > 0 and r["time_vs_vllm"] is not None
            assert r["tokens_per_step"] > 1.0 or r["step"] == 0  # step 0: one answer a prompt, nothing to draw on
    # our router sends a prompt back to the replica that holds its past, where the drafter recalls it
    assert rows[-1]["past_found"] == 1.0 and rows[-1]["tokens_per_step"] > rows[-3]["tokens_per_step"]
    synth = tmp_path / "s.jsonl"
    assert cli(["trace", "synth", "--prompts", "2", "--group-size", "4", "--max-len", "64", "--out", str(synth)]) == 0
    capsys.readouterr()
    for flags, match in [(["--spec", "suffix"], "--spec-accept"), (["--spec", "eagle"], "--spec 'eagle'"),
                         (["--spec", "suffix", "--spec-accept", "2"], "--spec-accept"),
                         (["--spec", "suffix", "--spec-tokens", "0", "--spec-accept", "0.5"], "--spec-tokens"),
                         (["--spec", "group", "--spec-accept", "0.5", "--backend", "transformers"], "transformers")]:
        assert cli(["replay", "--trace", str(synth), "--num-blocks", "200", *flags]) == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err
    assert cli(["replay", "--trace", str(synth), "--num-blocks", "200", "--spec", "off,group", "--spec-accept", "0.5",
                "--json"]) == 0
    labels = [json.loads(ln)["spec"] for ln in capsys.readouterr().out.splitlines()]
    assert labels[:2] == ["off", "group@0.5"]


def test_the_drafter_hears_what_the_server_knows_of_a_length_never_the_truth():
    """The replay's requests tell the drafter what the server's do (one function, ``drafter.hints``): a sample's
    group, its predicted length or else its token budget, never its true length; a probe is a head, at the
    prediction it was sent with; its rest counts its response from the sample's prompt, at the prediction after the
    probe."""
    from infsample_lab.replay.backends import InfiniteBackend, StepSample

    from verl_infsample.drafter.hints import GROUP_ARG, HEAD_ARG, PREDICTED_ARG, RESPONSE_START_ARG

    def sent(predictor: str, probe_tokens: int = 0):
        backend = InfiniteBackend(1, predictor, 300, probe_tokens=probe_tokens)
        samples = [StepSample(f"s{i}", "g", (1, 2, 3), 0, i, 50, opening=(7,) * 8) for i in range(2)]
        return backend, backend.route(samples)[0]

    _, (whole, _) = sent("history")  # nothing learned of the prompt yet: the budget
    assert whole.hints == {GROUP_ARG: "g", PREDICTED_ARG: 300}
    backend, (probed, _) = sent("learned:k=4", probe_tokens=4)
    order_request = backend._requests["s0"]
    assert probed.hints[HEAD_ARG] and probed.hints[PREDICTED_ARG] == 300 and probed.request_id == "s0-probe"
    assert probed.rest.hints == {GROUP_ARG: "g", RESPONSE_START_ARG: 3,
                                 PREDICTED_ARG: int(order_request.sample.predicted_len or 300)}
    _, (oracle, _) = sent("oracle")
    assert oracle.hints[PREDICTED_ARG] == 50  # the oracle's prediction: its own, the replay adds nothing


