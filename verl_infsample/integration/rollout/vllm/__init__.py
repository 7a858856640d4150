"""``rollout.name=infinite`` on vLLM: verl's vLLM server (``server``) with the plan's order in front of vLLM's
scheduler (``order``: priorities from ``priority``, probes from ``probe``) and vLLM's per-step figures (``stats``).
The order is pure Python (no Ray, no vLLM); the server runs it on its event loop, between vLLM's engine steps."""
