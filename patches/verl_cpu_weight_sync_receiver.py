"""CPU runs (opt-in only): the vLLM worker's end of verl's weight-sync socket, named per Ray cluster.

What: ``vLLMColocateWorkerExtension._get_zmq_handle`` (``verl/workers/rollout/vllm_rollout/utils.py``) names the
socket the vLLM worker connects to for new weights, the one ``ServerAdapter`` binds. The patched method returns
verl's name with the raylet's pid in it, as ``verl_cpu_weight_sync_sender.py`` makes the trainer bind (why: see
``verl_infsample.integration.cpu.weight_sync_socket``).

Why a patch: the path is built inside the method from a literal and the job id; no config key reaches it.
"""

TARGET = "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._get_zmq_handle"
# sha256 of the dedented source of the target in verl 0.9.1 (checked before applying; tests/test_cpu_platform.py too)
SOURCE_SHA256 = "f9d548bcb1b8f444b704507ee0e6003ab8b5404797b26c162ef7d124ccbd970d"


def apply(module) -> None:
    from verl_infsample.integration.cpu import wrap_once
    from verl_infsample.integration.cpu.weight_sync_socket import scoped_to_raylet

    def wrap(original):
        def _get_zmq_handle(self) -> str:
            return scoped_to_raylet(original(self))

        return _get_zmq_handle

    wrap_once(module.vLLMColocateWorkerExtension, "_get_zmq_handle", wrap)
