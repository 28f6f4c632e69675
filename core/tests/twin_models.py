"""Two tiny mlx-lm models with the same weights: one to keep plain, one to rewrite (fuse
projections, bind attributes), so a test compares their outputs."""

from __future__ import annotations

import mlx.core as mx

SHAPE = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300, rope_theta=10000.0,
             tie_word_embeddings=False)


def twin_models(module, args: dict) -> tuple:
    """Two ``module.Model``s of ``args``, the second holding the first's weights."""
    mx.random.seed(3)
    a = module.Model(module.ModelArgs(**args))
    b = module.Model(module.ModelArgs(**args))
    b.update(a.parameters())
    mx.eval(a.parameters(), b.parameters())
    return a, b
