"""Everything that touches verl: registration (``plugin``), settings, the ``infinite`` rollout (``rollout/``), the
actor-update balancer (``balance``) and verl on the CPU (``cpu/``). The core, predictors and engines know none of it.

Where it runs: ``plugin`` in every process that imports verl (driver, TaskRunner, workers, server actors);
``settings`` in verl's ``validate_config``, before Ray starts; ``balance`` in the TaskRunner (the trainer);
``rollout/`` in the replicas' server actors and the workers (its own first page says which part where);
``vllm_plugin`` in every process vLLM starts (its CPU patches, opt-in)."""
