"""Each writer gaplan uses, failing for real on a disk fault, and what gaplan.core.disk makes of its exception.

    python writer_faults.py DIR [FSIZE_BYTES]

Writes 4 MiB with each writer into DIR: torch.save, safetensors' save_file, distributed checkpoint (one process,
no process group), transformers' save_pretrained, Python's own open/write. With FSIZE_BYTES the process's
RLIMIT_FSIZE is set to it first (CPython ignores SIGXFSZ, so a write past it fails with EFBIG); without it DIR should
be a small file system that fills. Prints one JSON object: each writer's exception class and the errno
disk_errno found in it (null: taken for a bug).
"""

import json
import os
import resource
import sys

import torch

from gaplan.core.disk import disk_errno

PAYLOAD = 1 << 20  # float32 elements: 4 MiB


def attempts(folder: str) -> dict:
    state = {"weight": torch.ones(PAYLOAD)}

    def torch_save():
        torch.save(state, os.path.join(folder, "state.pt"))

    def safetensors_save():
        from safetensors.torch import save_file

        save_file(state, os.path.join(folder, "weights.safetensors"))

    def distributed_checkpoint():
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": state}, checkpoint_id=os.path.join(folder, "shards"))

    def save_pretrained():
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=1, n_embd=256, n_head=4, vocab_size=4096, n_positions=32)
        GPT2LMHeadModel(config).save_pretrained(os.path.join(folder, "model"))

    def python_write():
        with open(os.path.join(folder, "plain.bin"), "wb") as handle:
            handle.write(b"\0" * (4 * PAYLOAD))

    return {"torch.save": torch_save, "safetensors": safetensors_save, "dcp.save": distributed_checkpoint,
            "save_pretrained": save_pretrained, "open/write": python_write}


def main() -> None:
    folder = sys.argv[1]
    if len(sys.argv) > 2:
        limit = int(sys.argv[2])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    found = {}
    for name, attempt in attempts(folder).items():
        try:
            attempt()
            found[name] = {"raised": None, "errno": None}
        except BaseException as exc:  # noqa: BLE001 - what each writer raises is the point (dcp's is a BaseException)
            found[name] = {"raised": type(exc).__name__, "errno": disk_errno(exc, folder, 4 * PAYLOAD)}
    found["a bug"] = {"raised": "TypeError", "errno": disk_errno(TypeError("unsupported operand"), folder, 0)}
    found["a runtime bug"] = {"raised": "RuntimeError",
                              "errno": disk_errno(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), folder, 0)}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
