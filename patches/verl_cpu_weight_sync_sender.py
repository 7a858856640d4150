"""CPU runs (opt-in only): the trainer's end of verl's weight-sync socket, named per Ray cluster.

What: ``ServerAdapter.__init__`` (``verl/workers/rollout/vllm_rollout/vllm_rollout.py``) names the socket it binds
to send weights to the colocated vLLM worker ``ipc:///tmp/rl-colocate-zmq-{job_id}-replica-{r}-rank-{k}.sock``.
Two verl runs on one host, each with its own Ray cluster, both have job id ``01000000`` and bind the same path; one
of them then hangs in its first weight sync. The patched ``__init__`` puts the raylet's pid into the name
(``verl_infsample.integration.cpu.weight_sync_socket``); ``verl_cpu_weight_sync_receiver.py`` does the same at the
vLLM end, so the two still meet.

Why a patch: the path is built inside ``__init__`` from a literal and the job id; no config key reaches it.
"""

TARGET = "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.__init__"
# sha256 of the dedented source of the target in verl 0.9.1 (checked before applying; tests/test_cpu_platform.py too)
SOURCE_SHA256 = "43eb8875a3e884ca7d588d629c2e120ce962f4f90c116200f88c135663e0170f"


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once
    from verl_infsample.integration.cpu.weight_sync_socket import scoped_to_raylet

    def wrap(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.zmq_handle = scoped_to_raylet(self.zmq_handle)

        return __init__

    wrap_once(module.ServerAdapter, "__init__", wrap)
