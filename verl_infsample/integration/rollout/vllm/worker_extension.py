"""What our vLLM server asks of vLLM's workers, beside verl's colocate extension (weight updates, sleep): the group
drafter's figures. vLLM mixes the class named by ``worker_extension_cls`` into its worker; ``collective_rpc`` calls
its methods by name in every worker."""

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from ....spec.group_drafter import pop_drafter_stats


class InfiniteWorkerExtension(vLLMColocateWorkerExtension):
    def infsample_pop_drafter_stats(self) -> dict | None:
        return pop_drafter_stats(self)


CLASS_PATH = f"{__name__}.InfiniteWorkerExtension"
