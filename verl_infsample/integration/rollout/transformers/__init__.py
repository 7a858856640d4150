"""``rollout.name=infinite`` on the transformers engine: our own server actor (``server``) batching a step's requests
(``batching``) into the core scheduler, which a rollout thread drives with the engine (``live_rollout``); its
driver-side replica (``replica``) and worker-side adapter (``adapter``)."""
