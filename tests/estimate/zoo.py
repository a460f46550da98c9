"""The estimate's zoo: small models of twelve architectures, built from their transformers configs, none of them a
preset the estimate was tuned on. ``python -m tests.estimate.zoo`` prints the estimate against real CPU trials for
each, full fine-tuning and LoRA, at a small micro-batch and a larger one (``tests/estimate/test_zoo.py`` holds both
to 3%). ``python -m tests.estimate.zoo --optimizers --json docs/data/zoo_optimizers.json`` measures full fine-tuning
with each optimizer other than AdamW that runs on the CPU instead (docs/levers.md renders its table from that file)."""

from __future__ import annotations

import argparse
import json

# 256 wide, not 128: a CPU trial's heap beyond its tensors moves by about 0.5 MiB from one fresh process to the next
# (docs/estimate.md, "Run to run"), 2-4% of a 4 x 128 model's 20-50 MiB peak at micro-batch 2 and 1% of these.
HIDDEN, LAYERS, VOCAB, SEQ_LEN = 256, 4, 256, 128
SIZES = (2, 16)
OPTIMIZERS = ("adamw-8bit", "adafactor", "lion")  # gaplan's optimizers besides AdamW and SGD that run on the CPU


def zoo_configs() -> dict:
    """Architecture family (transformers' ``model_type``) -> a config of 4 layers x 256, vocab 256, no dropout."""
    import transformers

    ffn, gated_ffn = 4 * HIDDEN, HIDDEN * 43 // 16  # a gated MLP (Llama's) has about 8/3 of the width, not 4
    decoder = dict(hidden_size=HIDDEN, intermediate_size=gated_ffn, num_hidden_layers=LAYERS, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return {
        "llama": transformers.LlamaConfig(**decoder),
        "mistral": transformers.MistralConfig(**decoder, sliding_window=64),
        "qwen2": transformers.Qwen2Config(**decoder),
        "gemma": transformers.GemmaConfig(**dict(decoder, num_key_value_heads=1), head_dim=HIDDEN // 4),
        "phi3": transformers.Phi3Config(**decoder, pad_token_id=0),
        "gpt_neox": transformers.GPTNeoXConfig(hidden_size=HIDDEN, intermediate_size=ffn, num_hidden_layers=LAYERS,
                                               num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=512),
        "opt": transformers.OPTConfig(hidden_size=HIDDEN, ffn_dim=ffn, num_hidden_layers=LAYERS, num_attention_heads=4,
                                      vocab_size=VOCAB, max_position_embeddings=512, word_embed_proj_dim=HIDDEN,
                                      dropout=0.0, attention_dropout=0.0),
        "gpt2": transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=4, vocab_size=VOCAB, n_positions=512,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        "bert": transformers.BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                                        intermediate_size=ffn, vocab_size=VOCAB, max_position_embeddings=512,
                                        **no_dropout, architectures=["BertForMaskedLM"]),
        "roberta": transformers.RobertaConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                                              intermediate_size=ffn, vocab_size=VOCAB, max_position_embeddings=514,
                                              pad_token_id=1, **no_dropout, architectures=["RobertaForMaskedLM"]),
        "t5": transformers.T5Config(d_model=HIDDEN, d_kv=HIDDEN // 4, d_ff=ffn, num_layers=LAYERS, num_heads=4,
                                    vocab_size=VOCAB, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0),
        "bart": transformers.BartConfig(d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=ffn,
                                        decoder_ffn_dim=ffn, vocab_size=VOCAB, max_position_embeddings=512,
                                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
    }


def machine() -> str:
    """The CPU's model name and core count: a failed comparison says which machine measured it."""
    import os

    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    except OSError:
        model = "?"
    return f"{model}, {os.cpu_count()} cores"


def zoo_measurements(family: str, folder: str, lora: bool,
                     optimizer: str = "adamw") -> tuple[dict[int, int], dict[int, int]]:
    """The estimated and the measured peak (a real CPU trial: fresh process, 2 threads) at each of :data:`SIZES`."""
    from gaplan.estimate import trace_steps
    from gaplan.worker.client import WorkerProcess
    from gaplan.workload.spec import WorkloadSpec

    zoo_configs()[family].save_pretrained(folder)
    spec = WorkloadSpec(model=folder, seq_len=SEQ_LEN, lora=lora, lora_targets="all-linear" if lora else None,
                        optimizer=optimizer)
    estimated = {row.micro_batch: row.peak_bytes for row in trace_steps(spec, list(SIZES), device_kind="cpu", threads=2)}
    with WorkerProcess(spec, "cpu", 4 * 2**30, threads=2) as worker:
        measured = {size: worker.trial(size, optimizer_steps=2).peak_bytes for size in SIZES}
    return estimated, measured


def errors(estimated: dict[int, int], measured: dict[int, int]) -> dict[int, float]:
    """The estimate's error at each micro-batch, as a fraction of the measured peak."""
    return {size: (estimated[size] - measured[size]) / measured[size] for size in SIZES}


def main(argv: list[str] | None = None) -> None:
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.estimate.zoo", description=__doc__)
    parser.add_argument("families", nargs="*", help="zoo families (default: all twelve)")
    parser.add_argument("--optimizers", action="store_true",
                        help=f"full fine-tuning with {', '.join(OPTIMIZERS)} instead of AdamW full and LoRA")
    parser.add_argument("--json", metavar="FILE", help="also write the measurements to FILE")
    args = parser.parse_args(argv)
    cases = [(optimizer, False) for optimizer in OPTIMIZERS] if args.optimizers else [("adamw", False),
                                                                                       ("adamw", True)]
    rows = []
    print(f"| family | fine-tuning | optimizer | {' | '.join(f'peak at micro-batch {size}' for size in SIZES)} | "
          "activations per sample, estimated vs measured |")
    print(f"|---|---|---|{'--:|' * len(SIZES)}---|")
    with tempfile.TemporaryDirectory(prefix="gaplan-zoo-") as directory:
        for family in args.families or list(zoo_configs()):
            for optimizer, lora in cases:
                estimated, measured = zoo_measurements(family, f"{directory}/{family}", lora, optimizer)
                cells = " | ".join(f"{100 * e:+.2f}%" for e in errors(estimated, measured).values())
                small, large = SIZES
                slopes = [(peaks[large] - peaks[small]) / (large - small) / 2**20 for peaks in (estimated, measured)]
                print(f"| {family} | {'LoRA' if lora else 'full'} | {optimizer} | {cells} | {slopes[0]:.3f} vs "
                      f"{slopes[1]:.3f} MiB |", flush=True)
                rows.append({"family": family, "lora": lora, "optimizer": optimizer,
                             "estimated": {str(k): v for k, v in estimated.items()},
                             "measured": {str(k): v for k, v in measured.items()}})
                if args.json:  # after each row: a long run stopped part way keeps what it measured
                    write_record(args.json, rows, argv)


def write_record(path: str, rows: list[dict], argv: list[str] | None) -> None:
    """The measurements of ``rows`` with the machine and versions that made them, as JSON at ``path``."""
    import datetime

    import bitsandbytes
    import torch
    import transformers

    record = {"date": datetime.date.today().isoformat(), "machine": machine(), "torch": torch.__version__,
              "transformers": transformers.__version__, "bitsandbytes": bitsandbytes.__version__,
              "threads": 2, "seq_len": SEQ_LEN, "sizes": list(SIZES),
              "command": "python -m tests.estimate.zoo " + " ".join(argv if argv is not None else []), "rows": rows}
    with open(path, "w") as out:
        json.dump(record, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
