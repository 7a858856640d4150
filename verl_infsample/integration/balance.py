"""verl integration of the sequence-length balancer: the V1 sync trainer with our actor-update batch partitioning.

Importing this module imports verl (``verl.trainer.ppo.v1``, a few seconds) and registers, through verl's own
``register_trainer`` hook and idempotently, the trainer mode ``TRAINER_MODE = "infinite_sync"``:

    trainer.use_v1=True trainer.v1.trainer_mode=infinite_sync

selects :class:`InfiniteSyncTrainer`, verl's ``PPOTrainerSync`` whose ``_balance_batch`` partitions the global batch
over the DP ranks with :func:`verl_infsample.core.partition.balanced_partitions` (seeded with verl's own
Karmarkar-Karp partitions, so never worse than them) instead of ``get_seqlen_balanced_partitions``. Everything else
``_balance_batch`` does (DP size lookup, padding up to the batch multiple, workload model, in-place reorder,
``global_seqlen/*`` metrics) is verl's code, unchanged; ``infsample/seqlen_balance_*`` metrics are added.

With ``rollout.name=infinite`` it also adds the rollout servers' ``infsample/*`` metrics (decode steps, peak KV,
preemptions, plan time, ...) to every step's metrics (:meth:`InfiniteSyncTrainer.step`).

The registry lives in the process that looks the trainer up: verl's ``TaskRunnerV1.run`` calls ``get_trainer_cls``
inside the TaskRunner *Ray actor*, so this module must be imported in that worker process, not only in the driver.
The plugin does that: ``verl_infsample.register()`` (run by ``import verl`` through the ``verl.plugins`` entry
point) imports this module as soon as a process imports ``verl.trainer.ppo.v1``, so no configuration is needed and
no other process pays for the import. (``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=
verl_infsample.integration.balance.register`` also works, at the price of the import in every Ray worker.)

Why the trainer reports ``trainer_mode == "sync"``: verl's base class branches on ``self.trainer_mode == "sync"``
(replay-buffer class, exact refill, TransferQueue checkpointing, re-issuing in-flight prompts) and reads
``trainer.v1.<mode>`` for its settings. A registry name other than "sync" would silently switch those to the async
code paths, and "sync" itself cannot be re-registered (verl's ``register_trainer`` refuses a second class under a
taken name). So the registry name only selects the class; the instance keeps sync semantics (see
:attr:`InfiniteSyncTrainer.trainer_mode`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import os
import textwrap

import numpy as np
import torch

from verl.trainer.ppo.v1 import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import seqlen_balancing

from verl_infsample.core.partition import balanced_partitions, partition_spread

logger = logging.getLogger(__name__)

TRAINER_MODE = "infinite_sync"
METRIC_RATIO = "infsample/seqlen_balance_ratio"  # max / mean partition workload, ours
METRIC_RATIO_KK = "infsample/seqlen_balance_ratio_kk"  # max / mean partition workload, verl's Karmarkar-Karp
METRIC_VS_KK = "infsample/seqlen_balance_vs_kk"  # our max partition workload / KK's, on the same batch (<= 1)

# sha256 of the dedented source of verl 0.9.1's ``PPOTrainer._balance_batch``, which our override mirrors line for
# line except the partitioning call. A mismatch means verl changed it: re-sync the copy below.
VERL_BALANCE_BATCH_SHA256 = "358620695a10c66e9b8409e7e7da3c7a72151cb39022c5f0e06b1ea12d10cdc5"

_trainer_base = importlib.import_module("verl.trainer.ppo.v1.trainer_base")
# verl's own function, even if someone (a test) has swapped the module attribute for ours
_verl_karmarkar_karp = getattr(seqlen_balancing.karmarkar_karp, "__wrapped__", seqlen_balancing.karmarkar_karp)


def _as_values(seqlen_list) -> list:
    if isinstance(seqlen_list, torch.Tensor):
        return seqlen_list.detach().cpu().tolist()
    if isinstance(seqlen_list, np.ndarray):
        return seqlen_list.tolist()
    return list(seqlen_list)


def karmarkar_karp(seqlen_list, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Drop-in for ``verl.utils.seqlen_balancing.karmarkar_karp``: same arguments, same result structure (k lists of
    int indices into ``seqlen_list``, every index once, partitions by decreasing sum; n / k items each with
    ``equal_size``), but the partitions of :func:`balanced_partitions` seeded with verl's own Karmarkar-Karp, so the
    largest partition sum is never larger than verl's. ``seqlen_list`` holds the values to balance (verl passes
    ``calculate_workload`` of the sequence lengths), as a list or a tensor."""
    values = _as_values(seqlen_list)
    if equal_size:
        assert len(values) % k_partitions == 0, f"{len(values)} % {k_partitions} != 0"  # verl's own check
    kk = _verl_karmarkar_karp(values, k_partitions, equal_size)
    return balanced_partitions(values, k_partitions, equal_size, incumbents=[kk], kk_seed=False)


karmarkar_karp.__wrapped__ = _verl_karmarkar_karp


def balanced_seqlen_partitions(workload_lst, k_partitions: int) -> tuple[list[list[int]], dict]:
    """Equal-size partitions of a global batch over ``k_partitions`` DP ranks, with the balance metrics.

    Returns what ``get_seqlen_balanced_partitions(workload_lst, k_partitions, equal_size=True)`` returns (validated
    and with sorted indices), and ``{METRIC_RATIO, METRIC_RATIO_KK, METRIC_VS_KK}``.
    """
    values = _as_values(workload_lst)
    assert len(values) >= k_partitions, f"number of items:[{len(values)}] < k_partitions:[{k_partitions}]"
    kk = _verl_karmarkar_karp(values, k_partitions, True)
    ours = balanced_partitions(values, k_partitions, True, incumbents=[kk], kk_seed=False)
    _check_partitions(ours, len(values), k_partitions)
    spread, spread_kk = partition_spread(values, ours), partition_spread(values, kk)
    metrics = {
        METRIC_RATIO: spread["max_over_mean"],
        METRIC_RATIO_KK: spread_kk["max_over_mean"],
        METRIC_VS_KK: spread["max"] / spread_kk["max"] if spread_kk["max"] > 0 else 1.0,
    }
    return ours, metrics


def _check_partitions(partitions: list[list[int]], n: int, k: int) -> None:
    """The checks of verl's ``get_seqlen_balanced_partitions`` (k non-empty partitions covering range(n))."""
    assert len(partitions) == k, f"{len(partitions)} != {k}"
    assert all(len(p) > 0 for p in partitions), "a partition is empty"
    assert sorted(i for p in partitions for i in p) == list(range(n))


class InfiniteSyncTrainer(PPOTrainerSync):
    """verl's synchronous V1 trainer, balancing the actor-update batch over DP ranks with our partitioning, and
    adding the rollout servers' ``infsample/*`` metrics to each step's metrics (with ``rollout.name=infinite``)."""

    @property
    def trainer_mode(self) -> str:
        """Always "sync": verl branches on this string, and this trainer must keep the sync code paths. The configured
        name (``trainer.v1.trainer_mode``, e.g. "infinite_sync"), which verl's ``__init__`` assigns here, is kept in
        ``registered_trainer_mode``."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_trainer_mode = value

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step, plus the ``infsample/*`` figures of this step's rollout from every rollout server.

        In the sync trainer the step's rollout happens inside ``step`` (prompts are dispatched in ``prepare_step``,
        the replay buffer waits for all samples), so the servers' accumulators are emptied before (dropping what
        validation rollouts left there) and read after it."""
        servers = self._rollout_servers()
        if servers:
            import ray

            ray.get([pop() for pop in servers])
        batch = super().step(metrics, timing_raw)
        if servers:
            import ray

            from verl_infsample.integration.rollout.metrics import merge_rollout_metrics

            metrics.update(merge_rollout_metrics(ray.get([pop() for pop in servers]), parallel=True))
        return batch

    def _rollout_servers(self) -> list:
        """For each rollout server, a call that returns its step figures: ``pop_step_metrics`` of ours
        (``rollout.name=infinite``); of verl's vLLM servers, those ``rollout.vllm.stats`` recorded where
        ``VERL_INFSAMPLE_VLLM_STATS=1`` instrumented them (none otherwise, nor for other backends)."""
        from verl_infsample.integration.rollout.vllm import stats as vllm_stats

        name = self.config.actor_rollout_ref.rollout.name
        if name == "vllm" and os.environ.get(vllm_stats.STATS_ENV) == "1":
            def pop(server):
                return lambda: server.__ray_call__.remote(vllm_stats.pop_step_metrics)
        elif name == "infinite":
            def pop(server):
                return server.pop_step_metrics.remote
        else:
            return []
        manager = getattr(self, "llm_server_manager", None)
        replicas = manager.get_replicas() if manager is not None else []
        return [pop(server) for replica in replicas for server in replica.servers]

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """Reorder the data on single controller such that each dp rank gets similar total workload.

        verl 0.9.1's ``PPOTrainer._balance_batch`` line for line (``keep_minibatch`` is unused there too), except that
        the partitions come from :func:`balanced_seqlen_partitions` and its metrics are added."""
        # get actor dp size
        role, worker_group = "actor", self.actor_rollout_wg
        if role not in worker_group._dispatch_info:
            dp_rank_mapping = worker_group._query_dispatch_info(role)
            worker_group._dispatch_info[role] = dp_rank_mapping
        else:
            dp_rank_mapping = worker_group._dispatch_info[role]
        dp_size = max(dp_rank_mapping) + 1

        # Upsampling the batch with padding sequences
        batch_multiple = self._get_required_batch_multiple(dp_size)
        batch = _trainer_base.upsample_batch_to_divisible_size(batch, batch_multiple, self.tokenizer.eos_token_id)
        global_seqlen_lst = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
        workload_lst = _trainer_base.calculate_workload(global_seqlen_lst)

        # reorder based on index. The data will be automatically equally partitioned by dispatch function
        global_partition_lst, infsample_stats = balanced_seqlen_partitions(workload_lst, k_partitions=dp_size)
        batch.reorder([j for partition in global_partition_lst for j in partition])
        global_balance_stats = _trainer_base.log_seqlen_unbalance(
            seqlen_list=global_seqlen_lst.tolist(), partitions=global_partition_lst, prefix=logging_prefix
        )
        metrics.update(global_balance_stats)
        metrics.update(infsample_stats)
        return batch


def verl_balance_batch_sha256() -> str:
    """Fingerprint of the installed verl's ``PPOTrainer._balance_batch`` source."""
    source = textwrap.dedent(inspect.getsource(_trainer_base.PPOTrainer._balance_batch))
    return hashlib.sha256(source.encode()).hexdigest()


def register() -> type:
    """Register :class:`InfiniteSyncTrainer` under ``TRAINER_MODE`` in verl's trainer registry (idempotent).

    Also usable as Ray's ``worker_process_setup_hook`` ("verl_infsample.integration.balance.register"), so the trainer is
    registered in the TaskRunner actor, where verl looks it up."""
    existing = _trainer_base.TRAINER_REGISTRY.get(TRAINER_MODE)
    if existing is None:
        register_trainer(TRAINER_MODE)(InfiniteSyncTrainer)
        if verl_balance_batch_sha256() != VERL_BALANCE_BATCH_SHA256:
            logger.warning("verl's PPOTrainer._balance_batch differs from the version InfiniteSyncTrainer mirrors "
                           "(verl 0.9.1): check verl_infsample/integration/balance.py against it.")
        return InfiniteSyncTrainer
    if existing is InfiniteSyncTrainer:
        return existing
    if (existing.__module__, existing.__qualname__) == (InfiniteSyncTrainer.__module__, "InfiniteSyncTrainer"):
        return existing  # this module was reloaded: the class registered first stays (verl forbids replacing it)
    raise ValueError(f"trainer mode {TRAINER_MODE!r} is already registered to {existing!r}")


register()
