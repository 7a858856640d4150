"""Per-request vLLM seeds, so that a sample's tokens do not depend on the schedule that decoded it.

vLLM samples unseeded requests from one generator shared by the batch, so two schedules of the same requests draw
different tokens and different lengths, and their engine steps differ by chance as much as by schedule. With
``VERL_INFSAMPLE_REQUEST_SEEDS=1`` every vLLM server verl builds in this process, verl's own and ours, gives each
request the seed of (rollout seed, training step, prompt, its arrival rank among that prompt's requests), unless
the caller set one: the same requests draw the same tokens under any schedule, up to the float rounding that batch
shapes change. ``infsample bench-verl`` arms it for both backends. vLLM samples seeded requests one by one, which
costs a little time per step on a GPU, so a training run leaves it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import defaultdict

SEEDS_ENV = "VERL_INFSAMPLE_REQUEST_SEEDS"


def request_seed(seed: int, step: int | None, prompt_ids, rank: int) -> int:
    text = f"{seed}/{step}/{','.join(str(int(t)) for t in prompt_ids)}/{rank}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


def seed_requests(server_module) -> None:
    """Wrap ``server_module.vLLMHttpServer.generate`` to seed every request as the module docstring says
    (idempotent)."""
    server_class = server_module.vLLMHttpServer
    if getattr(server_class.generate, "_infsample_seeded", False):
        return
    generate = server_class.generate

    @functools.wraps(generate)
    async def seeded(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        ranks = self.__dict__.setdefault("_infsample_ranks", defaultdict(int))
        if self.__dict__.get("_infsample_step") != self.global_steps:
            ranks.clear()
            self._infsample_step = self.global_steps
        key = tuple(int(t) for t in prompt_ids)
        rank, ranks[key] = ranks[key], ranks[key] + 1
        if sampling_params.get("seed") is None:
            sampling_params = {**sampling_params,
                               "seed": request_seed(self.config.seed, self.global_steps, prompt_ids, rank)}
        return await generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs)

    seeded._infsample_seeded = True
    server_class.generate = seeded


def seed_requests_when_asked() -> None:
    """With ``VERL_INFSAMPLE_REQUEST_SEEDS=1``, seed verl's vLLM server's requests wherever it is imported."""
    if os.environ.get(SEEDS_ENV) == "1":
        from verl_infsample.integration.import_hooks import when_imported
        from verl_infsample.integration.rollout.vllm.stats import SERVER_MODULE

        when_imported(SERVER_MODULE, seed_requests)
