"""Run under torchrun with 2 ranks: rank 1 runs out of memory once; both ranks must switch together.

Writes rank 0's final weights to argv[1] and a JSON summary per rank to argv[1] + ".rank<N>.json".
"""

import json
import sys

from safetensors.torch import save_file

from gaplan.data import SyntheticCorpus
from gaplan.distributed import init_distributed
from gaplan.plan import make_plan
from gaplan.training import TrainConfig, train
from gaplan.workload import WorkloadSpec, build_workload

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.1)


def main(out: str) -> None:
    dist = init_distributed("cpu")
    workload = build_workload(SPEC, "cpu", seed=0)
    raw_loss = workload.raw_loss
    state = {"raised": False}

    def flaky(model, batch):
        if dist.rank == 1 and not state["raised"] and batch["input_ids"].shape[0] == 4:
            state["raised"] = True
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes (injected)")
        return raw_loss(model, batch)

    workload.raw_loss = flaky
    result = train(workload, make_plan(16, 4, 2), SyntheticCorpus(16, seed=0), TrainConfig(steps=2, seed=0))
    if dist.rank == 0:
        save_file({k: v.clone() for k, v in workload.model.state_dict().items()}, out)  # clone: tied weights
    with open(f"{out}.rank{dist.rank}.json", "w") as handle:
        json.dump({"fallbacks": result.oom_fallbacks, "micro_batch": result.plan.micro_batch,
                   "raised": state["raised"]}, handle)


if __name__ == "__main__":
    main(sys.argv[1])
