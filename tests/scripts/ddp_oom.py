"""Run under torchrun with 2 ranks: rank 1 runs out of memory once; both ranks must switch together.

argv[2] says where: ``first`` (the forward of the first micro-step), ``last`` (the forward of the last one,
after the ranks' first vote) or ``backward`` (the backward of the last one, which DDP synchronizes: the peers wait
in its all-reduce, so no vote can reach them and the rank stops with a one-line error). Writes rank 0's final
weights to argv[1] and a JSON summary per rank to argv[1] + ".rank<N>.json".
"""

import json
import sys

from safetensors.torch import save_file

from gaplan.data import SyntheticCorpus
from gaplan.parallel.process_group import init_distributed
from gaplan.plan.split import make_plan
from gaplan.training.loop import TrainConfig, train
from gaplan.workload.build import WorkloadSpec, build_workload

SPEC = WorkloadSpec(model="tiny-gpt2", seq_len=16, optimizer="sgd", lr=0.1)


def _out_of_memory():
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes (injected)")


def main(out: str, where: str = "first") -> None:
    dist = init_distributed("cpu")
    workload = build_workload(SPEC, "cpu", seed=0)
    raw_loss = workload.raw_loss
    state = {"raised": False, "calls": 0}
    failing_call = 1 if where == "first" else 2  # plan 16 over 2 ranks at 4: two micro-steps a rank

    def flaky(model, batch):
        state["calls"] += 1
        fail = dist.rank == 1 and not state["raised"] and state["calls"] == failing_call
        # In the last micro-step, fail after the model's forward (DDP's own pre-forward collectives done), as an
        # OOM in the logits or the loss would; in the first, before it.
        loss = raw_loss(model, batch) if not fail or where != "first" else None
        if fail and where == "backward":  # mid-backward: the first block's gradient comes after the later blocks'
            state["raised"] = True
            weight = workload.model.transformer.h[0].ln_1.weight
            handle = weight.register_hook(lambda grad: (handle.remove(), _out_of_memory())[1])
            return loss
        if fail:
            state["raised"] = True
            _out_of_memory()
        return loss

    workload.raw_loss = flaky
    result = train(workload, make_plan(16, 4, 2), SyntheticCorpus(16, seed=0), TrainConfig(steps=2, seed=0))
    if dist.rank == 0:
        save_file({k: v.clone() for k, v in workload.model.state_dict().items()}, out)  # clone: tied weights
    with open(f"{out}.rank{dist.rank}.json", "w") as handle:
        json.dump({"fallbacks": result.oom_fallbacks, "micro_batch": result.plan.micro_batch,
                   "raised": state["raised"]}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "first")
