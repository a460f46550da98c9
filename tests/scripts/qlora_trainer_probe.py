"""Probe a Llama folder's LoRA or QLoRA model through its Trainer in this fresh process, and print each fitting
trial's peak as JSON: ``python qlora_trainer_probe.py lora|qlora FOLDER``.

A fresh process: a forked trial of a long-lived one (a test run) reuses the parent's freed, still-resident heap, which
its resident peak does not see. The LoRA model is built from the folder's config (random weights: transformers maps
a folder's safetensors into memory, and file-backed pages are neither in the CPU budget nor in its peak); the QLoRA
one is loaded with transformers' BitsAndBytesConfig, its 4-bit weights made in the trial.
"""

import json
import sys
import tempfile


def main(what, folder):
    import torch
    import transformers

    from gaplan.integrations.trainer_probe import probe_trainer

    config = transformers.AutoConfig.from_pretrained(folder)

    def model_init():
        import peft  # in the trial: with bitsandbytes installed, importing peft on CUDA initializes it

        if what == "qlora":
            quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_use_double_quant=True,
                                                           bnb_4bit_compute_dtype=torch.float32)
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, device_map={"": "cpu"},
                                                                      quantization_config=quantization)
        else:
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(config)
        return peft.get_peft_model(model, peft.LoraConfig(r=8, task_type="CAUSAL_LM"))

    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 300, (64,), generator=generator),
             "labels": torch.randint(0, 300, (64,), generator=generator)} for _ in range(8)]

    def collate(batch):
        return {k: torch.stack([r[k] for r in batch]) for k in ("input_ids", "labels")}

    with tempfile.TemporaryDirectory() as output_dir:
        args = transformers.TrainingArguments(output_dir=output_dir, use_cpu=True, report_to=[], save_strategy="no",
                                              disable_tqdm=True, remove_unused_columns=False,
                                              dataloader_pin_memory=False)
        result = probe_trainer(model_init, args, rows, effective_batch=32, data_collator=collate,
                               memory_limit="192MiB", search_cap=32)
    print(json.dumps({t.micro_batch: t.peak_bytes for t in result.trials if t.fits}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
