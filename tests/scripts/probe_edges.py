"""Probe the edge of a user's loop in this fresh process and print it as JSON: ``python probe_edges.py WHAT LIMIT``.

WHAT: ``loop`` (gaplan.probe_loop on plain_hf_loop's functions), ``nanogpt`` (on nanogpt_like_loop's), ``trainer``
or ``trainer-lora`` (probe_trainer on hf_trainer_loop's Trainer, through model_init). The tests then train B* and B*+1 in fresh
processes under gaplan.cpu_budget (plain_hf_loop.py / hf_trainer_loop.py).
"""

import json
import os
import sys
import tempfile

import gaplan  # first, as a user's script imports it

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(what, limit):
    # Only the script that the fresh check runs is imported: the probe's process holds the same code as that one.
    if what == "loop":
        import plain_hf_loop

        result = gaplan.probe_loop(plain_hf_loop.setup, plain_hf_loop.make_batch, plain_hf_loop.micro_step,
                                   memory_limit=limit, effective_batch=64)
    elif what == "nanogpt":
        import nanogpt_like_loop as loop

        result = gaplan.probe_loop(loop.setup, loop.make_batch, loop.micro_step, loop.optimizer_step,
                                   memory_limit=limit, effective_batch=64)
    else:
        import hf_trainer_loop

        from gaplan.integrations.trainer_probe import probe_trainer

        lora = what == "trainer-lora"
        with tempfile.TemporaryDirectory() as output_dir:
            result = probe_trainer(lambda: hf_trainer_loop.model(lora), hf_trainer_loop.args(output_dir),
                                   hf_trainer_loop.dataset(), effective_batch=64,
                                   data_collator=hf_trainer_loop.collate, memory_limit=limit)
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
