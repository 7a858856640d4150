"""``infsample eval-drafter``: tokens per step of each drafter, offline, on a user's own multi-sample text.

    infsample eval-drafter --groups G.jsonl --tokenizer words|MODEL_DIR --drafter ngram,suffix,group
                           [--history H] [--wave W] [--max-draft K] [--json]

``G.jsonl`` has one prompt a line: ``{"prompt_id", "prompt", "responses": [...]}``. The first H responses of each
prompt finish before the rest start (a probe round, or an earlier epoch); then the rest of W prompts decode side by
side, each row advancing 1 + accepted tokens a step. A draft token is accepted when it equals the response's next
token: the exact coupling of rejection sampling with a point-mass draft, so tokens per step here is what vLLM's
verification would give on this text. The drafters are the product's own: vLLM's ``NgramProposer`` and
``SuffixDecodingProposer`` (one global tree, as ``custom.speculative=suffix`` runs it) and ``GroupDrafter``, each
built from the config ``custom.speculative`` gives vLLM, and fed a batch shaped as vLLM's ``InputBatch``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace

import numpy as np

from verl_infsample.core.text_groups import PromptGroup, load_groups, make_tokenizer
from verl_infsample.drafter.budget import DraftPlanner, StepCost

DRAFTERS = ("ngram", "suffix", "group")
# drafters that do not ship, measured to decide whether to build them: ``group_gpu``, the matching a device-resident
# group drafter would run (``group_match``)
MODELED_DRAFTERS = ("group_gpu",)


@dataclass
class DrafterResult:
    drafter: str
    tokens_per_step: float  # response tokens per row per step (1.0: no draft ever accepted)
    drafted_per_step: float  # draft tokens proposed per row per step
    propose_us_per_row: float  # the drafter's time per row per step on this CPU (proposing, reading the verdicts)
    responses: int  # responses measured (the first H of each prompt are history, not measured)
    tokens: int
    history: int
    wave: int
    max_draft: int


class OfflineBatch:
    """The fields of vLLM's ``InputBatch`` the proposers read, for rows that leave as they finish (the last row
    moves into the freed place, as vLLM condenses its batch)."""

    def __init__(self, rows: int, max_len: int):
        self.req_ids: list[str] = []
        self.req_id_to_index: dict[str, int] = {}
        self.num_prompt_tokens = np.zeros(rows, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(rows, dtype=np.int32)
        self.token_ids_cpu = np.zeros((rows, max_len), dtype=np.int32)

    def add(self, req_id: str, prompt: list[int]) -> None:
        i = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = i
        self.num_prompt_tokens[i] = self.num_tokens_no_spec[i] = len(prompt)
        self.token_ids_cpu[i, :len(prompt)] = prompt

    def append(self, i: int, tokens: list[int]) -> None:
        n = int(self.num_tokens_no_spec[i])
        self.token_ids_cpu[i, n:n + len(tokens)] = tokens
        self.num_tokens_no_spec[i] = n + len(tokens)

    def remove(self, i: int) -> None:
        last = len(self.req_ids) - 1
        del self.req_id_to_index[self.req_ids[i]]
        if i != last:
            n = int(self.num_tokens_no_spec[last])
            self.token_ids_cpu[i, :n] = self.token_ids_cpu[last, :n]
            self.num_prompt_tokens[i] = self.num_prompt_tokens[last]
            self.num_tokens_no_spec[i] = n
            self.req_ids[i] = self.req_ids[last]
            self.req_id_to_index[self.req_ids[i]] = i
        self.req_ids.pop()


def vllm_config(method: str, k: int, max_model_len: int, max_num_seqs: int):
    """The parts of a ``VllmConfig`` the proposers read: ``custom.speculative``'s config over vLLM's defaults."""
    from vllm.config import SpeculativeConfig

    from verl_infsample.integration.settings import InfiniteRolloutSettings

    spec = {f.name: getattr(f.default, "default", f.default)  # pydantic wraps some defaults in a FieldInfo
            for f in fields(SpeculativeConfig) if f.name.startswith(("suffix_", "prompt_"))}
    spec.update(InfiniteRolloutSettings(speculative=method, speculative_tokens=k).speculative_config())
    return SimpleNamespace(speculative_config=SimpleNamespace(**spec),
                           model_config=SimpleNamespace(max_model_len=max_model_len),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1))


class Proposer:
    """One drafter behind one call: ``propose(batch, sampled) -> drafts``, and ``verified`` for the ones that
    learn from the verdicts."""

    def __init__(self, method: str, k: int, max_model_len: int, max_num_seqs: int, cost: StepCost | None = None):
        """``cost``: what a step costs, for the budget of ``group`` and ``group_gpu`` (None: drafts cost
        nothing)."""
        if method not in DRAFTERS + MODELED_DRAFTERS:
            raise ValueError(f"--drafter {method!r}: choose from {', '.join(DRAFTERS + MODELED_DRAFTERS)}")
        config = vllm_config(method, k, max_model_len, max_num_seqs) if method in DRAFTERS else None
        self.method, self.k = method, k
        self._proposed = 0
        self.planner: DraftPlanner | None = None  # the budget of the drafters that have one
        if method == "ngram":
            from vllm.v1.spec_decode.ngram_proposer import NgramProposer

            self.impl = NgramProposer(config)
        elif method == "suffix":
            from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

            self.impl = SuffixDecodingProposer(config)
        elif method == "group":
            from verl_infsample.drafter import GroupDrafter

            self.impl = GroupDrafter(config, runner=object())
            self.planner = self.impl.drafting.planner
        elif method == "group_gpu":
            from .group_match import GroupMatchDrafter

            self.impl = GroupMatchDrafter(k)
            self.planner = self.impl.planner
        if cost is not None and self.planner is not None:
            self.planner.budget.cost = cost

    def propose(self, batch: OfflineBatch, sampled: list[list[int]], requests=None) -> list[list[int]]:
        """``requests``: vLLM's requests by id, whose ``extra_args`` the group drafter reads (the server's hints)."""
        if self.method == "ngram":
            self._proposed += sum(1 for s in sampled if s)
            return self.impl.propose(self.k, sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
        if self.method == "suffix":
            self._proposed += sum(1 for s in sampled if s)
            return self.impl.propose(self.k, batch, sampled)
        if self.method == "group_gpu":
            return self.impl.propose(batch, sampled, requests)
        return self.impl.propose_batch(batch, sampled, requests)

    @property
    def drafting_s(self) -> float | None:
        """The group drafter's time on the rows that drafted (None: vLLM's proposers draft on every row)."""
        return self.impl.drafting.stats.drafting_s if self.method == "group" else None

    @property
    def proposing_rows(self) -> int:
        """Rows proposed for so far: vLLM's own proposers every decoding row, the group drafter those its budget
        let propose."""
        if self.method == "group_gpu":
            return self.impl.proposing_rows
        return self.impl.drafting.stats.proposing_rows if self.method == "group" else self._proposed

    def verified(self, req_ids, drafts, outputs) -> None:
        if self.method == "group":
            self.impl.drafting.verified(req_ids, drafts, outputs)
        elif self.method == "group_gpu":
            self.impl.verified(req_ids, drafts, outputs)

    def step_took(self, seconds: float) -> None:
        """The step that verified the last drafts took ``seconds`` (the budgets learn from it)."""
        if self.planner is not None:
            self.planner.step_took(seconds)


@dataclass
class _Tally:
    tokens: int = 0
    row_steps: int = 0
    drafted: int = 0
    propose_s: float = 0.0
    responses: int = 0


def _decode_round(proposer: Proposer, rows: list[tuple[str, list[int], list[int]]], tally: _Tally | None) -> None:
    """Decode ``rows`` (request id, prompt, response) side by side until each has its whole response."""
    max_len = max(len(p) + len(r) for _, p, r in rows) + proposer.k + 2
    batch = OfflineBatch(len(rows), max_len)
    responses, done = {}, {}
    sampled: list[list[int]] = []
    for req_id, prompt, response in rows:  # the prefill step samples each row's first token
        batch.add(req_id, prompt)
        batch.append(len(batch.req_ids) - 1, response[:1])
        responses[req_id], done[req_id] = response, 1
        sampled.append(response[:1])
    if tally is not None:
        tally.row_steps += len(rows)
        tally.tokens += len(rows)
        tally.responses += len(rows)
    while batch.req_ids:
        finished = [i for i, r in enumerate(batch.req_ids) if done[r] >= len(responses[r])]
        for i in sorted(finished, reverse=True):  # finished rows leave before the next proposal
            batch.remove(i)
            sampled[i] = sampled[-1]
            sampled.pop()
        if not batch.req_ids:
            break
        start = time.perf_counter()
        drafts = proposer.propose(batch, sampled)
        elapsed = time.perf_counter() - start
        outputs, sampled = [], []
        for i, req_id in enumerate(batch.req_ids):
            draft, response, at = list(drafts[i])[:proposer.k], responses[req_id], done[req_id]
            accepted = 0
            while (accepted < len(draft) and at + accepted < len(response)
                   and draft[accepted] == response[at + accepted]):
                accepted += 1
            gained = response[at:at + accepted + 1]
            outputs.append(gained + [-1] * (len(draft) + 1 - len(gained)))
            sampled.append(gained)
            done[req_id] = at + len(gained)
            batch.append(i, gained)
            if tally is not None:
                tally.tokens += len(gained)
                tally.row_steps += 1
                tally.drafted += len(draft)
        verdicts = (list(batch.req_ids), [list(d)[:proposer.k] for d in drafts], outputs)
        start = time.perf_counter()
        proposer.verified(*verdicts)
        if tally is not None:  # the drafter's time: its proposing and what it learns from the verdicts
            tally.propose_s += elapsed + time.perf_counter() - start


def evaluate(groups: list[PromptGroup], method: str, *, history: int = 0, wave: int = 8,
             max_draft: int = 8) -> DrafterResult:
    """Drafts cost nothing here (no step is timed), so every drafter drafts what its sources offer and tokens per
    step compares the sources alone; ``infsample replay`` prices them."""
    if history < 0 or wave < 1 or max_draft < 1:
        raise ValueError(f"need --history >= 0, --wave >= 1, --max-draft >= 1 (got {history}, {wave}, {max_draft})")
    max_len = max(len(g.prompt) + max(map(len, g.responses)) for g in groups) + max_draft + 2
    rows_at_once = wave * max(len(g.responses) for g in groups)
    proposer = Proposer(method, max_draft, max_len, max(1, rows_at_once))
    tally = _Tally()
    for w in range(0, len(groups), wave):
        part = groups[w:w + wave]
        earlier = [(f"{g.prompt_id}/{j}", g.prompt, r) for g in part for j, r in enumerate(g.responses[:history])]
        if earlier:
            _decode_round(proposer, earlier, None)
        rest = [(f"{g.prompt_id}/{j}", g.prompt, r) for g in part for j, r in enumerate(g.responses)
                if j >= history]
        if rest:
            _decode_round(proposer, rest, tally)
    steps = max(1, tally.row_steps)
    return DrafterResult(method, tally.tokens / steps, tally.drafted / steps, 1e6 * tally.propose_s / steps,
                         tally.responses, tally.tokens, history, wave, max_draft)


def add_eval_drafter_parser(sub) -> None:
    p = sub.add_parser("eval-drafter", help="tokens per step of each drafter on your own multi-sample text")
    p.add_argument("--groups", required=True, help='JSONL, one prompt a line: {"prompt_id", "prompt", "responses"}')
    p.add_argument("--tokenizer", default="words", help="words (whitespace words) or a model folder")
    p.add_argument("--drafter", default=",".join(DRAFTERS),
                   help=f"comma-separated, of: {', '.join(DRAFTERS + MODELED_DRAFTERS)} (group_gpu: does not ship)")
    p.add_argument("--history", type=int, default=0, help="responses per prompt finished before the rest start")
    p.add_argument("--wave", type=int, default=8, help="prompts decoding side by side")
    p.add_argument("--max-draft", type=int, default=8, help="draft tokens per row at most (speculative_tokens)")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    p.set_defaults(func=_cmd_eval_drafter)


def _cmd_eval_drafter(args) -> int:
    from verl_infsample.report import format_table

    methods = [m.strip() for m in args.drafter.split(",") if m.strip()]
    unknown = [m for m in methods if m not in DRAFTERS + MODELED_DRAFTERS]
    if unknown or not methods:
        raise ValueError(f"--drafter {args.drafter!r}: choose from {', '.join(DRAFTERS + MODELED_DRAFTERS)}")
    groups = load_groups(args.groups, make_tokenizer(args.tokenizer))
    results = [evaluate(groups, m, history=args.history, wave=args.wave, max_draft=args.max_draft)
               for m in methods]
    if args.json:
        for r in results:
            print(json.dumps(asdict(r)))
    else:
        print(format_table([asdict(r) for r in results], [f.name for f in fields(DrafterResult)]))
    return 0
