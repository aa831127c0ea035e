"""Small transformers models built from configs (random weights, nothing
downloaded), and transformers' own registrations of its caches with
torch.utils._pytree. For the processes of bridge_worker.py and dist_worker.py:
the registrations are global, so they stay out of the test process."""

from __future__ import annotations

from typing import Any

import torch


class Step(torch.nn.Module):
    """One forward of a language model with the cache returned."""

    def __init__(self, model: torch.nn.Module, encoder_decoder: bool) -> None:
        super().__init__()
        self.model, self.encoder_decoder = model, encoder_decoder

    def forward(self, ids: torch.Tensor) -> Any:
        if self.encoder_decoder:
            return self.model(input_ids=ids, decoder_input_ids=ids[:, :3], use_cache=True)
        return self.model(ids, use_cache=True)


def gpt2() -> Step:
    """GPT-2 of 2 layers of width 16 (seed 0, no dropout): a DynamicCache."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return Step(transformers.GPT2LMHeadModel(config), False)


def t5() -> Step:
    """T5 of 2 + 2 layers of width 16 (seed 0, no dropout): an EncoderDecoderCache."""
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
        num_heads=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0,
    )  # fmt: skip
    return Step(transformers.T5ForConditionalGeneration(config), True)


def register_caches() -> None:
    """transformers' registrations: DynamicCache with keyed children (its
    executorch support), EncoderDecoderCache in its exporter's generic form."""
    import transformers
    from transformers.exporters.exporter_dynamo import register_pytree_node
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    transformers.logging.set_verbosity_error()
    register_dynamic_cache_export_support()
    register_pytree_node(transformers.EncoderDecoderCache)
