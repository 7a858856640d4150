"""The patches the plugin applies to verl and vLLM, each pinned to its target's source: README.md here."""
