"""Two ranks under torchrun on two cards: NCCL's memory outside the allocator, and a DDP trial's reserved peak.

Run by ``test_gpu_nccl.py`` as ``torchrun --nproc-per-node 2 tests/gpu/nccl_ranks.py MICRO_BATCH``. Each rank binds
its card, forms an NCCL group, and reads how much of the card its process holds outside PyTorch's allocator
(``total - free - memory_reserved``) before and after the first collective (NCCL makes its communicator and its
buffers then); then it trains two DDP steps of tiny-gpt2 (seq 256) at MICRO_BATCH and reads ``max_memory_reserved``.
Rank 0 prints one JSON line with every rank's figures.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def outside(device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free - torch.cuda.memory_reserved(device)


def main() -> None:
    from torch.nn.parallel import DistributedDataParallel

    from gaplan.training.step import accumulate_gradients
    from gaplan.workload.build import build_workload
    from gaplan.workload.spec import WorkloadSpec

    micro_batch = int(sys.argv[1])
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")  # no device_id: NCCL makes its communicator at the first collective
    torch.ones(1, device=device).sum().item()  # the context's kernels, before the first reading
    before = outside(device)
    flag = torch.ones(1, device=device)
    dist.all_reduce(flag)
    torch.cuda.synchronize(device)
    nccl = outside(device) - before
    workload = build_workload(WorkloadSpec(model="tiny-gpt2", seq_len=256), device, load_weights=False)
    model = DistributedDataParallel(workload.model, device_ids=[rank])
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(2):
        batches = [workload.make_batch(micro_batch) for _ in range(2)]
        accumulate_gradients(model, batches, workload.raw_loss, workload.task, workload.loss_is_scaled_for_ga,
                             workload.autocast)
        workload.optimizer.step()
        workload.optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    mine = torch.tensor([nccl, torch.cuda.max_memory_reserved(device)], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if rank == 0:
        print(json.dumps({"nccl_bytes": [int(t[0]) for t in every], "peak_bytes": [int(t[1]) for t in every]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
