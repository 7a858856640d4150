"""Everything that touches verl: registration (``plugin``), settings, the ``infinite`` rollout (``rollout/``), the
actor-update balancer (``balance``) and verl on the CPU (``cpu/``). The core, predictors and engines know none of it."""
