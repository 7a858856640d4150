"""The lab of verl-infsample: what measures and demonstrates the plugin, never installed with it.

``replay`` (GPU-scale rollouts through vLLM's own scheduler and a step-cost model), ``bench`` (benchmarks inside
verl and on the engines, the GPU checks), ``models`` (tiny Hugging Face checkpoints built offline), ``tasks``
(the data and rewards of the examples) and ``demo`` (``make demo``). ``make setup`` installs it beside the
plugin (``pip install -e lab``); its commands join ``infsample`` through the ``infsample.commands`` entry points.
"""
