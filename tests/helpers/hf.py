"""A tiny HF Llama built offline from a config, and the token dataset it trains on."""

import torch

SEQ, VOCAB = 8, 64


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_llama():
    import transformers  # the tests that train it skip without it

    # Eager attention: its score and value matmuls are aten bmm, which FlopCounterMode counts too.
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   num_hidden_layers=2, vocab_size=VOCAB, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg)
