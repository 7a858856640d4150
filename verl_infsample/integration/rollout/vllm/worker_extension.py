"""What our vLLM server asks of vLLM's workers, beside verl's colocate extension (weight updates, sleep): the group
drafter's figures, and stopping its drafts. vLLM mixes the class named by ``worker_extension_cls`` into its worker;
``collective_rpc`` calls its methods by name in every worker; what they do there is the drafter's
(``drafter.vllm_adapter``, its contact 7)."""

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from ....drafter import halt_drafter, pop_drafter_stats


class InfiniteWorkerExtension(vLLMColocateWorkerExtension):
    def infsample_pop_drafter_stats(self) -> dict | None:
        return pop_drafter_stats(self)

    def infsample_halt_drafter(self) -> None:
        halt_drafter(self)


CLASS_PATH = f"{__name__}.InfiniteWorkerExtension"
