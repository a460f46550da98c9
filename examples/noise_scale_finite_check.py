"""The noise scale on a finite corpus drawn without replacement, against brute force (issue 58).

    python examples/noise_scale_finite_check.py --seeds 0:30                 # the reading, seeds 0-29 (~1 min)
    python examples/noise_scale_finite_check.py --seeds 0:3 --independent    # counting the draws as independent
    python examples/noise_scale_finite_check.py --seeds 0:10 --adaptive      # where adaptive stops (3 to 96)
    torchrun --nproc-per-node 2 examples/noise_scale_finite_check.py --seeds 0:6   # over 2 DDP ranks (gloo)

The point and the runs are those of ``tests/training/test_noise_scale_finite.py``: a next-token MLP trained on 240
sequences until the exact ``B_simple`` (every per-sample gradient, float64) is 0.33 of the corpus, then gaplan's own
causal-LM data path at that point (SGD at 1e-12), effective batch 96 = 4 x 24, 200 steps a seed. ``--independent``
measures with the drawing taken as independent (the estimator before issue 58). Prints one line a seed and a summary.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:10", help="FIRST:END, the data orders' seeds")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--independent", action="store_true", help="take the draws as independent (uncorrected)")
    parser.add_argument("--adaptive", action="store_true", help="run --batch-schedule adaptive from 3 to 96 instead")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    from gaplan.plan.draws import Drawing
    from gaplan.plan.schedule import BatchSchedule
    from gaplan.plan.split import make_plan
    from gaplan.training import loop
    from gaplan.training.config import TrainConfig
    from tests.training import finite_corpus
    from tests.training import test_noise_scale_finite as check

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    state, samples, (grad_sq, grad_var, exact) = check._point()
    world = dist.get_world_size() if dist.is_initialized() else 1
    mode = "independent" if args.independent else "corrected"
    if args.independent:
        loop._drawing = lambda workload, corpus: Drawing()  # noqa: SLF001 - the estimator before issue 58
    if rank0:
        print(f"exact: |G|^2 {grad_sq:.6g}, tr(S) {grad_var:.6g}, B_simple {exact:.2f} samples = "
              f"{exact / check.SAMPLES:.3f} N (N = {check.SAMPLES}); world size {world}; {mode}")
    first, end = (int(x) for x in args.seeds.split(":"))
    if args.adaptive:
        schedule = BatchSchedule("adaptive", minimum=3, maximum=96)
        level = next(e for e in schedule.levels if 2 * e >= exact)
        finals = []
        for seed in range(first, end):
            net = finite_corpus.model(check.VOCAB)
            net.load_state_dict(state)
            result = loop.train(finite_corpus.workload(net, check.LENGTH), make_plan(96, 24), samples,
                                TrainConfig(steps=args.steps, seed=seed, schedule=schedule))
            logs = result.logs
            changes = [(b.step, b.effective_batch) for a, b in zip(logs, logs[1:], strict=False)
                       if a.effective_batch != b.effective_batch]
            finals.append(logs[-1].effective_batch)
            if rank0:
                print(f"seed {seed}: final effective batch {logs[-1].effective_batch}, changes (step, batch) {changes}")
        if rank0:
            print(f"{mode}: the rule's level {level}; final batches {dict(sorted(collections.Counter(finals).items()))}; "
                  f"past the level {sum(f > level for f in finals)} of {len(finals)}")
        return
    ratios, misses = [], 0
    for seed in range(first, end):
        measured, half, _, _ = check.reading(seed, args.steps)
        ratios.append(measured / exact)
        miss = abs(exact / measured - 1) > half
        misses += miss
        if rank0:
            print(f"seed {seed}: measured/exact {measured / exact:.4f}, 95% interval "
                  f"{measured * (1 - half) / exact:.4f}-{measured * (1 + half) / exact:.4f}{'  MISS' if miss else ''}")
    if rank0:
        print(f"{mode}: mean {statistics.mean(ratios):.4f}, range {min(ratios):.4f}-{max(ratios):.4f}, within 3%: "
              f"{sum(abs(r - 1) < 0.03 for r in ratios)} of {len(ratios)}, intervals missed {misses} of {len(ratios)}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
