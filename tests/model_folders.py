"""Small Hugging Face model folders built offline, for tests: a config, random weights, a trained tokenizer.

Import it from any test (``from tests.model_folders import make_llama_folder``). Nothing is downloaded:
the config is written by hand, the weights are a random init saved with ``save_pretrained``, and the
tokenizer is a byte-level BPE trained by the ``tokenizers`` library on a few lines.
"""

from __future__ import annotations

import os

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
TRAINING_LINES = [
    "the quick brown fox jumps over the lazy dog",
    "gradient accumulation makes a large batch fit in a small memory",
    "a memory planner finds the largest micro-batch that fits",
    "pack my box with five dozen liquor jugs",
    "hello world, hello tokenizer, hello model",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
]


def make_tokenizer(path: str, vocab_size: int = 300):
    """Train a byte-level BPE tokenizer on a few lines and save it (``tokenizer.json`` and friends) in ``path``."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(TRAINING_LINES, trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                                     eos_token="</s>", unk_token="<unk>")
    os.makedirs(path, exist_ok=True)
    tokenizer.save_pretrained(path)
    return tokenizer


def llama_config(vocab_size: int, **overrides):
    import transformers

    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=vocab_size, max_position_embeddings=128,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["LlamaForCausalLM"])
    kwargs.update(overrides)
    return transformers.LlamaConfig(**kwargs)


def gpt2_config(vocab_size: int, **overrides):
    import transformers

    kwargs = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=vocab_size, n_positions=128, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  architectures=["GPT2LMHeadModel"])
    kwargs.update(overrides)
    return transformers.GPT2Config(**kwargs)


def bart_config(vocab_size: int, **overrides):
    """A small BART (encoder-decoder, learned positions, ``shift_tokens_right``), without dropout."""
    import transformers

    kwargs = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=vocab_size,
                  max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                  architectures=["BartForConditionalGeneration"])
    kwargs.update(overrides)
    return transformers.BartConfig(**kwargs)


def make_bart_folder(path: str, with_tokenizer: bool = False, vocab_size: int = 300, **overrides) -> str:
    """A BART seq2seq folder (config only: probes and estimates need no weights)."""
    os.makedirs(path, exist_ok=True)
    if with_tokenizer:
        vocab_size = len(make_tokenizer(path))
    bart_config(vocab_size, **overrides).save_pretrained(path)
    return str(path)


def _make_folder(path: str, make_config, with_weights: bool, with_tokenizer: bool, sharded: bool, seed: int,
                 vocab_size: int) -> str:
    import torch
    import transformers

    from gaplan.workload.model_io import quiet_transformers

    os.makedirs(path, exist_ok=True)
    if with_tokenizer:
        vocab_size = len(make_tokenizer(path))
    config = make_config(vocab_size)
    if not with_weights:
        config.save_pretrained(path)
        return str(path)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with quiet_transformers():  # no progress bar in the tests' output
        model.save_pretrained(path, max_shard_size="50KB" if sharded else "50GB")
    return str(path)


def make_llama_folder(path: str, with_weights: bool = True, with_tokenizer: bool = True, sharded: bool = False,
                      seed: int = 1234, vocab_size: int = 300) -> str:
    """A Llama-style causal LM folder (2 layers x 64); the vocabulary is the tokenizer's when it has one."""
    return _make_folder(str(path), llama_config, with_weights, with_tokenizer, sharded, seed, vocab_size)


def make_gpt2_folder(path: str, with_weights: bool = True, with_tokenizer: bool = True, sharded: bool = False,
                     seed: int = 1234, vocab_size: int = 300) -> str:
    """A GPT-2 causal LM folder (2 layers x 64, tied input/output embeddings)."""
    return _make_folder(str(path), gpt2_config, with_weights, with_tokenizer, sharded, seed, vocab_size)


def weights_files(path: str) -> list[str]:
    """The weights files of a folder (safetensors, bins and their index files), sorted."""
    return sorted(name for name in os.listdir(path)
                  if name.endswith((".safetensors", ".bin")) or name.endswith(".index.json"))


def convert_to_bin(path: str) -> str:
    """Replace a folder's single ``model.safetensors`` with ``pytorch_model.bin`` (the older format).

    transformers 5 only writes safetensors; an old-format folder is what ``save_pretrained`` wrote
    before, a ``torch.save`` of the same state dict.
    """
    import torch
    from safetensors.torch import load_file

    source = os.path.join(path, "model.safetensors")
    torch.save(load_file(source), os.path.join(path, "pytorch_model.bin"))
    os.remove(source)
    return str(path)
