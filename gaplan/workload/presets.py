"""The built-in models, by name: small ones to train and test on the CPU, and published shapes to plan for (a
random init from the config, never a download). No torch."""

from __future__ import annotations

from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, MASKED_LM, SEQ2SEQ_LM

# Presets train without dropout (as most LLM pre-training does): accumulation over any split
# then gives the same gradient as one large batch, which the tests check bit for bit.
_NO_DROPOUT_GPT2 = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_NO_DROPOUT_BERT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_NO_DROPOUT_T5 = dict(dropout_rate=0.0)
# Llama-2's published config (meta-llama/Llama-2-*-hf config.json), less its shape.
_LLAMA_2 = dict(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                pad_token_id=0, tie_word_embeddings=False)

# name -> (config class name, config kwargs, task, default seq len, description)
PRESETS: dict[str, tuple[str, dict, str, int, str]] = {
    "tiny-gpt2": ("GPT2Config", dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=1024,
                                     bos_token_id=0, eos_token_id=0, **_NO_DROPOUT_GPT2),
                  CAUSAL_LM, 128, "GPT-2 style causal LM, 4 layers x 256, 6M parameters (default)"),
    "small-gpt2": ("GPT2Config", dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                                      **_NO_DROPOUT_GPT2),
                   CAUSAL_LM, 512, "GPT-2 small shape, 124M parameters"),
    "tiny-llama": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=4, vocab_size=8192,
                                       max_position_embeddings=2048, bos_token_id=0, eos_token_id=0,
                                       pad_token_id=0),
                   CAUSAL_LM, 256, "Llama style causal LM (RMSNorm, RoPE, SwiGLU), 4 layers x 256, 7M parameters"),
    "tiny-bert-mlm": ("BertConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=1024, vocab_size=8192, max_position_embeddings=512,
                                         **_NO_DROPOUT_BERT),
                      MASKED_LM, 128, "BERT style masked LM, 4 layers x 256, 5M parameters"),
    "tiny-bert-cls": ("BertConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=1024, vocab_size=8192, max_position_embeddings=512,
                                         num_labels=4, **_NO_DROPOUT_BERT),
                      CLASSIFICATION, 128, "BERT style sequence classifier (4 classes), 4 layers x 256"),
    "tiny-t5": ("T5Config", dict(d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=4,
                                 vocab_size=8192, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
                                 pad_token_id=0, eos_token_id=1, tie_word_embeddings=False, **_NO_DROPOUT_T5),
                SEQ2SEQ_LM, 128, "T5 v1.1 style encoder-decoder (gated GELU), 4 + 4 layers x 256, 12M parameters; "
                                   "targets half the source length by default"),
    # Published shapes, for planning (gaplan estimate / gaplan plan): a random init from the config, no download.
    "llama-2-7b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                       num_attention_heads=32, num_key_value_heads=32),
                   CAUSAL_LM, 4096, "Llama-2-7B shape (32 layers x 4096, 6.7B parameters; random init, no weights)"),
    # Llama-3-8B's published config (meta-llama/Meta-Llama-3-8B config.json): grouped-query attention, a 128K vocab.
    "llama-3-8b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                       bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False),
                   CAUSAL_LM, 8192, "Llama-3-8B shape (32 layers x 4096, grouped-query attention, 128K vocab, 8.0B "
                                    "parameters; random init, no weights)"),
    "llama-2-13b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                                        num_attention_heads=40, num_key_value_heads=40),
                    CAUSAL_LM, 4096, "Llama-2-13B shape (40 layers x 5120, 13B parameters; random init, no weights)"),
    "llama-2-70b": ("LlamaConfig", dict(_LLAMA_2, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                        num_attention_heads=64, num_key_value_heads=8),
                    CAUSAL_LM, 4096, "Llama-2-70B shape (80 layers x 8192, grouped-query attention, 69B parameters; "
                                     "random init, no weights)"),
}
