"""verl's side of the ``infinite`` rollout backend: the replica verl's driver holds, the adapter its training
workers hold, and the server that decodes, one subpackage per engine (``factory`` picks the engine from the rollout
config, the same on every process).

What runs where:

- **verl's driver and trainer** (the TaskRunner actor): ``factory.make_replica`` builds each replica; the
  group-affinity ``router`` (transformers engine) places whole groups on replicas; ``metrics`` merges the servers'
  ``infsample/*`` figures for verl's logger.
- **training workers**: ``factory.make_rollout_adapter``: verl's own vLLM ``ServerAdapter`` on vLLM, or
  ``transformers.adapter`` (weights, sleep and wake-up by Ray calls to the server actor).
- **one server actor per replica**, on its event loop: ``vllm.server`` (verl's vLLM server with the plan's
  request order, ``vllm.order``, probes, ``vllm.probe``, and the held rests; vLLM batches, caches and preempts in
  its own engine process) or ``transformers.server`` (the requests of a step, batched into the core scheduler,
  ``transformers.batching``).
- **the rollout thread** of a transformers server: ``transformers.live_rollout`` drives the core scheduler and the
  engine, one decode step at a time, taking arrivals between steps.
- **vLLM's engine process**: its stat logger's per-step figures (``vllm.stats``: vLLM calls our listener, which
  records them on the server's event loop).
- **vLLM's workers**: with ``custom.speculative=group`` the group drafter (``verl_infsample.drafter``: vLLM builds
  it in the runner of each worker, calls its ``propose`` each step, and its rejection sampler's verdicts reach it;
  it drafts in the engine's first tensor-parallel worker) and the worker extension the server's ``collective_rpc``
  calls (``vllm.worker_extension``: the drafter's figures, the law guard's stop); and the patches vLLM's plugin
  hook arms in every vLLM process (``integration.vllm_plugin``: the CPU sampler fixes on any CPU, the opt-in CPU
  patches, verl's pause keyword on any device).
"""
