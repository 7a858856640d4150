"""verl integration of the sequence-length balancer: registered trainer mode, drop-in Karmarkar-Karp, _balance_batch.

The only stand-in: the trainer object is built with ``object.__new__`` (verl's ``__init__`` needs Ray worker groups,
a tokenizer, datasets and TransferQueue), and given the few attributes ``_balance_batch`` reads: the actor worker
group's cached ``_dispatch_info`` (DP size), ``tokenizer.eos_token_id``, ``use_critic``, ``global_steps`` and the
config keys of ``_get_required_batch_multiple``. Everything it calls is verl's real code; the batch is a real
``transfer_queue.KVBatchMeta`` sized to the batch multiple, so verl's padding (which would write synthetic samples
to TransferQueue) returns it unchanged; a second test checks the padding call itself is delegated as verl makes it.
"""

import importlib.util
import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1 import get_trainer_cls  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils import seqlen_balancing  # noqa: E402

import verl_infsample.integration.balance as vb  # noqa: E402
from verl_infsample.core.partition import max_workload  # noqa: E402

DP = 4


def _seqlens(rng, n):
    return rng.integers(100, 501, n) + np.minimum(np.round(rng.lognormal(6.0, 1.0, n)), 4096).astype(np.int64)


def _batch(seqlens):
    tags = [{"seq_len": int(s), "prompt_len": 100, "response_len": int(s) - 100} for s in seqlens]
    return KVBatchMeta(keys=[f"uid{i}_0_0" for i in range(len(seqlens))], tags=tags, partition_id="train")


def _trainer():
    trainer = object.__new__(vb.InfiniteSyncTrainer)  # the only stand-in: see the module docstring
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [r for r in range(DP) for _ in range(2)]})
    trainer.tokenizer = SimpleNamespace(eos_token_id=2)
    trainer.use_critic = False
    trainer.global_steps = 1
    trainer.config = OmegaConf.create({
        "trainer": {"critic_warmup": 0},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 8}},
    })
    return trainer


def _rank_workloads(batch):
    """The per-DP-rank workloads verl's dispatch produces: the reordered batch cut into DP equal chunks."""
    lens = torch.tensor([t["seq_len"] for t in batch.tags], dtype=torch.int64)
    work = seqlen_balancing.calculate_workload(lens).tolist()
    m = len(work) // DP
    return [sum(work[r * m:(r + 1) * m]) for r in range(DP)]


def test_import_registers_the_trainer_mode():
    cls = get_trainer_cls(vb.TRAINER_MODE)
    assert cls is vb.InfiniteSyncTrainer
    assert issubclass(cls, PPOTrainerSync) and issubclass(cls, trainer_base.PPOTrainer)
    assert get_trainer_cls("sync") is PPOTrainerSync  # verl's own modes untouched
    assert vb.register() is cls and vb.register() is cls  # idempotent


def test_trainer_keeps_sync_semantics():
    """verl's __init__ assigns self.trainer_mode from the config and branches on == "sync" later: ours stays sync."""
    init_src = inspect.getsource(trainer_base.PPOTrainer.__init__)
    assert "self.trainer_mode = self.config.trainer.v1.trainer_mode" in init_src
    trainer = object.__new__(vb.InfiniteSyncTrainer)
    trainer.trainer_mode = vb.TRAINER_MODE  # what verl's __init__ does
    assert trainer.trainer_mode == "sync" and trainer.registered_trainer_mode == vb.TRAINER_MODE


def test_mirrored_balance_batch_matches_installed_verl():
    assert vb.verl_balance_batch_sha256() == vb.VERL_BALANCE_BATCH_SHA256, "verl changed _balance_batch: re-sync"


def test_user_facing_overrides_compose_with_verls_config():
    from hydra import compose, initialize_config_dir

    config_dir = Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "config"
    hook = "verl_infsample.integration.balance.register"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        compose(config_name="ppo_trainer", overrides=[  # verl takes both keys
            f"trainer.v1.trainer_mode={vb.TRAINER_MODE}",
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={hook}",
        ])
    module, _, func = hook.rpartition(".")
    assert getattr(importlib.import_module(module), func) is vb.register


def test_drop_in_karmarkar_karp_structure(rng):
    for n, k, equal_size in [(64, 4, True), (48, 8, True), (30, 4, False), (8, 8, True)]:
        values = seqlen_balancing.calculate_workload(torch.tensor(_seqlens(rng, n)))
        ref = seqlen_balancing.karmarkar_karp(values.tolist(), k, equal_size)
        ours = vb.karmarkar_karp(values, k, equal_size)  # verl passes a tensor
        assert isinstance(ours, list) and len(ours) == len(ref) == k
        assert all(isinstance(p, list) and all(type(i) is int for i in p) for p in ours)
        assert sorted(i for p in ours for i in p) == list(range(n))
        if equal_size:
            assert [len(p) for p in ours] == [n // k] * k
        sums = [sum(values[p].tolist()) for p in ours]
        assert sums == sorted(sums, reverse=True)  # like verl's: decreasing partition sums
        assert max(sums) <= max_workload(values.tolist(), ref)
    with pytest.raises(AssertionError):
        vb.karmarkar_karp([1, 2, 3], 2, True)


def test_drop_in_accepted_by_verl_callers(monkeypatch, rng):
    monkeypatch.setattr(seqlen_balancing, "karmarkar_karp", vb.karmarkar_karp)  # this test only
    seqlens = torch.tensor(_seqlens(rng, 32))
    workload = seqlen_balancing.calculate_workload(seqlens)
    parts = seqlen_balancing.get_seqlen_balanced_partitions(workload, k_partitions=DP, equal_size=True)
    assert [len(p) for p in parts] == [8] * DP and sorted(sum(parts, [])) == list(range(32))
    assert max_workload(workload.tolist(), parts) <= max_workload(
        workload.tolist(), vb._verl_karmarkar_karp(workload.tolist(), DP, True))

    from tensordict import TensorDict

    width = int(seqlens.max())
    mask = (torch.arange(width)[None, :] < seqlens[:, None]).long()
    td = TensorDict({"input_ids": torch.zeros(32, width, dtype=torch.long), "attention_mask": mask}, batch_size=[32])
    micro, idx = seqlen_balancing.rearrange_micro_batches(td, max_token_len=3 * width)
    assert sorted(sum(idx, [])) == list(range(32))
    assert all(int(m["attention_mask"].sum()) <= 3 * width for m in micro)


def test_balance_batch_reorders_and_logs(rng, capsys):
    trainer = _trainer()
    seqlens = _seqlens(rng, 64)  # 16 per rank: a size where KK leaves room
    ours_batch, verl_batch = _batch(seqlens), _batch(seqlens)
    ours_metrics, verl_metrics = {}, {}
    out = trainer._balance_batch(ours_batch, metrics=ours_metrics)
    verl_out = trainer_base.PPOTrainer._balance_batch(trainer, verl_batch, metrics=verl_metrics)  # verl's own

    assert out is ours_batch  # reordered in place and returned, as verl does
    assert sorted(out.keys) == sorted(_batch(seqlens).keys) and len(set(out.keys)) == 64
    assert all(out.tags[i]["seq_len"] == int(seqlens[int(key[3:].split("_")[0])]) for i, key in enumerate(out.keys))

    # verl's metrics are all there, the unbalanced ones identical; ours are added next to them
    assert set(ours_metrics) == set(verl_metrics) | {vb.METRIC_RATIO, vb.METRIC_RATIO_KK, vb.METRIC_VS_KK}
    for key in ("min", "max", "minmax_diff", "mean"):
        assert ours_metrics[f"global_seqlen/{key}"] == verl_metrics[f"global_seqlen/{key}"]

    ours_ranks, verl_ranks = _rank_workloads(out), _rank_workloads(verl_out)
    assert max(ours_ranks) <= max(verl_ranks)
    mean = sum(ours_ranks) / DP
    assert ours_metrics[vb.METRIC_RATIO] == pytest.approx(max(ours_ranks) / mean)
    assert ours_metrics[vb.METRIC_RATIO_KK] == pytest.approx(max(verl_ranks) / mean)
    assert ours_metrics[vb.METRIC_VS_KK] == pytest.approx(max(ours_ranks) / max(verl_ranks))
    with capsys.disabled():
        print(f"\n[verl_balance] 64 seqs / {DP} ranks: max/mean ours {ours_metrics[vb.METRIC_RATIO]:.6f}, "
              f"verl KK {ours_metrics[vb.METRIC_RATIO_KK]:.6f}, ours/KK {ours_metrics[vb.METRIC_VS_KK]:.6f}")


def test_balance_batch_delegates_padding_like_verl(monkeypatch, rng):
    """The padding step (TransferQueue writes in verl) is called exactly as verl calls it, and its result is used."""
    calls = []

    def fake_upsample(batch, batch_multiple, eos_token_id):
        calls.append((len(batch), batch_multiple, eos_token_id))
        extra = (-len(batch)) % batch_multiple
        return KVBatchMeta(keys=batch.keys + [f"pad{i}" for i in range(extra)],
                           tags=batch.tags + [{"seq_len": 128}] * extra, partition_id=batch.partition_id)

    monkeypatch.setattr(trainer_base, "upsample_batch_to_divisible_size", fake_upsample)
    trainer = _trainer()
    seqlens = _seqlens(rng, 50)  # not a multiple of lcm(DP, 2 * 8) = 16
    ours_metrics, verl_metrics = {}, {}
    out = trainer._balance_batch(_batch(seqlens), metrics=ours_metrics)
    verl_out = trainer_base.PPOTrainer._balance_batch(trainer, _batch(seqlens), metrics=verl_metrics)
    assert calls[0] == calls[1] == (50, 16, 2)
    assert len(out) == len(verl_out) == 64 and sum(k.startswith("pad") for k in out.keys) == 14
    assert max(_rank_workloads(out)) <= max(_rank_workloads(verl_out))
