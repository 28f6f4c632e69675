"""config.json contents for the tiny checkpoints ``build_checkpoint`` writes, per model_type.

Four classic shapes (qwen3, llama, qwen2, mistral) carry full Hugging Face-style configs.
Every other type starts from one common dict (the field names most mlx-lm ``ModelArgs``
share) plus the fields its own ``ModelArgs`` requires; mlx-lm ignores the rest. Sliding
windows are 16 tokens, so a short test prompt already wraps a rotating cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

MAX_POSITION_EMBEDDINGS = 4096
WINDOW = 16  # sliding-window length of every windowed type

_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
CLASSIC = tuple(_ARCHITECTURES)
# which tokenizer each shape gets: ChatML without BOS (Qwen) or with a BOS (Llama/Mistral)
LLAMA_STYLE = ("llama", "mistral")


@dataclass(frozen=True)
class Dims:
    """The sizes every config is built from."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def classic_config(shape: str, d: Dims, dtype: str, eos: int, bos: int) -> dict[str, Any]:
    """A qwen3/llama/qwen2/mistral config as those models publish it."""
    cfg: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[shape]], "model_type": shape,
        "hidden_size": d.hidden, "intermediate_size": d.inter, "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim, "vocab_size": d.vocab,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "rope_scaling": None, "torch_dtype": dtype, "use_cache": True, "eos_token_id": eos,
        "bos_token_id": bos,
    }
    if shape in LLAMA_STYLE:
        cfg.update(rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                   mlp_bias=False, pretraining_tp=1)
    else:
        cfg.update(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                   sliding_window=None, use_sliding_window=False, max_window_layers=d.layers)
    return cfg


def _common(model_type: str, d: Dims) -> dict[str, Any]:
    return {
        "model_type": model_type, "hidden_size": d.hidden, "intermediate_size": d.inter,
        "num_hidden_layers": d.layers, "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads, "head_dim": d.head_dim, "vocab_size": d.vocab,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS, "rms_norm_eps": 1e-6,
        "layer_norm_eps": 1e-5, "norm_eps": 1e-5, "norm_epsilon": 1e-5,
        "layer_norm_epsilon": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "rope_traditional": False, "partial_rotary_factor": 1.0, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": True,
    }


def _alternating(d: Dims, local: str = "sliding_attention") -> list[str]:
    """Local and full attention layers in turn, the last one full."""
    return [local if (d.layers - 1 - i) % 2 else "full_attention" for i in range(d.layers)]


def _moe(d: Dims) -> dict[str, Any]:
    return {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": d.hidden // 2,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _mla(d: Dims) -> dict[str, Any]:
    """DeepSeek's latent attention and routed experts, the first layer dense."""
    return {**_moe(d), "n_shared_experts": 1, "kv_lora_rank": 32, "q_lora_rank": 48,
            "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 1.0, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def _gemma4(d: Dims) -> dict[str, Any]:
    """Gemma 4: the later half of the layers reuse the KV of the earlier ones."""
    doubled = replace(d, layers=2 * d.layers)
    return {"num_hidden_layers": doubled.layers, "layer_types": _alternating(doubled),
            "num_kv_shared_layers": d.layers, "sliding_window": WINDOW,
            "global_head_dim": 2 * d.head_dim, "hidden_size_per_layer_input": d.head_dim,
            "vocab_size_per_layer_input": d.vocab, "use_double_wide_mlp": False,
            "enable_moe_block": False, "final_logit_softcapping": 30.0}


def _ministral3(d: Dims) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": MAX_POSITION_EMBEDDINGS}
    return {"rope_parameters": rope, "sliding_window": WINDOW, "layer_types": _alternating(d)}


def _mamba(d: Dims) -> dict[str, Any]:
    return {"state_size": 8, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
            "time_step_rank": 4, "intermediate_size": 2 * d.hidden}


def _mamba2(d: Dims) -> dict[str, Any]:
    return {"num_heads": 2 * d.hidden // d.head_dim, "state_size": 8, "n_groups": 1,
            "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
            "time_step_limit": [0.0, 100.0], "time_step_rank": "auto",
            "intermediate_size": 2 * d.hidden}


def _qwen3_next(d: Dims) -> dict[str, Any]:
    """Gated delta-net layers (recurrent state) with one full-attention layer, MoE MLPs."""
    return {**_moe(d), "linear_num_value_heads": d.heads, "linear_num_key_heads": d.kv_heads,
            "linear_key_head_dim": d.head_dim, "linear_value_head_dim": d.head_dim,
            "linear_conv_kernel_dim": 4, "shared_expert_intermediate_size": d.hidden,
            "partial_rotary_factor": 0.25, "full_attention_interval": d.layers,
            "tie_word_embeddings": False}


def _qwen3_5(d: Dims) -> dict[str, Any]:
    """Qwen3.5's text model: gated delta-net layers with one full-attention layer."""
    return {"linear_num_value_heads": d.heads, "linear_num_key_heads": d.kv_heads,
            "linear_key_head_dim": d.head_dim, "linear_value_head_dim": d.head_dim,
            "linear_conv_kernel_dim": 4, "full_attention_interval": d.layers,
            "partial_rotary_factor": 0.25, "tie_word_embeddings": False}


def _kimi_linear(d: Dims) -> dict[str, Any]:
    """Kimi Linear: delta-attention (KDA) layers with MLA layers between, MoE MLPs."""
    return {**_mla(d), "num_experts_per_token": 2, "model_max_length": MAX_POSITION_EMBEDDINGS,
            "linear_attn_config": {"num_heads": d.heads, "head_dim": d.head_dim,
                                   "short_conv_kernel_size": 4,
                                   "kda_layers": list(range(1, d.layers + 1, 2))},
            "moe_router_activation_func": "sigmoid", "tie_word_embeddings": False}


def _nemotron_h(d: Dims) -> dict[str, Any]:
    """Nemotron-H: Mamba-2 layers, an attention layer and MLP layers, by pattern."""
    pattern = ("M*-M" * d.layers)[:2 * d.layers]
    return {"hybrid_override_pattern": list(pattern), "num_hidden_layers": len(pattern),
            "mamba_num_heads": 2 * d.hidden // d.head_dim, "mamba_head_dim": d.head_dim,
            "mamba_proj_bias": False, "ssm_state_size": 8, "conv_kernel": 4, "n_groups": 1,
            "use_bias": False, "use_conv_bias": True, "time_step_limit": [0.0, 100.0]}


def _lfm2(d: Dims) -> dict[str, Any]:
    return {"conv_bias": False, "conv_L_cache": 3, "block_dim": d.hidden,
            "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": False, "block_ff_dim": d.inter,
            "layer_types": _alternating(d, "conv")}


def _falcon_h1(d: Dims) -> dict[str, Any]:
    return {"mamba_d_ssm": d.hidden, "mamba_n_heads": d.heads, "mamba_d_head": d.head_dim,
            "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_chunk_size": WINDOW,
            "mamba_n_groups": 1, "rope_theta": 10000.0}


def _jamba(d: Dims) -> dict[str, Any]:
    return {**_moe(d), "attn_layer_offset": 1, "attn_layer_period": 2,
            "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4,
            "mamba_d_state": 8, "mamba_expand": 2}


def _recurrent_gemma(d: Dims) -> dict[str, Any]:
    return {"conv1d_width": 4, "logits_soft_cap": 30.0, "attention_window_size": WINDOW,
            "block_types": ["recurrent", "attention"], "lru_width": d.hidden}


def _nested(inner: Callable[[Dims], dict[str, Any]],
            text_type: str) -> Callable[[Dims], dict[str, Any]]:
    """A wrapper type (a VLM's text part) whose model reads ``text_config``."""
    def build(d: Dims) -> dict[str, Any]:
        return {"text_config": {**_common(text_type, d), **inner(d)}}
    return build


_EXTRA: dict[str, Callable[[Dims], dict[str, Any]]] = {
    "gemma": lambda d: {},
    "phi3": lambda d: {"tie_word_embeddings": False},
    "cohere": lambda d: {"logit_scale": 0.0625, "use_qk_norm": False},
    "glm4": lambda d: {"partial_rotary_factor": 0.5},
    "starcoder2": lambda d: {},
    "olmo2": lambda d: {},
    "qwen3_moe": _moe,
    "mixtral": lambda d: {**_moe(d), "tie_word_embeddings": False},
    "deepseek_v3": _mla,
    "gemma3_text": lambda d: {"sliding_window": WINDOW, "sliding_window_pattern": 2,
                              "query_pre_attn_scalar": d.head_dim,
                              "rope_local_base_freq": 10000.0},
    "cohere2": lambda d: {"sliding_window": WINDOW, "sliding_window_pattern": 2,
                          "logit_scale": 0.0625},
    "gpt_oss": lambda d: {**_moe(d), "sliding_window": WINDOW,
                          "layer_types": _alternating(d), "intermediate_size": d.hidden},
    "olmo3": lambda d: {"sliding_window": WINDOW, "layer_types": _alternating(d)},
    "exaone4": lambda d: {"sliding_window": WINDOW, "sliding_window_pattern": "LG"},
    "ministral3": _ministral3,
    "mistral3": _nested(_ministral3, "ministral3"),
    "gemma4_text": _gemma4,
    "mamba": _mamba,
    "mamba2": _mamba2,
    "rwkv7": lambda d: {"a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8,
                        "decay_low_rank_dim": 8, "tie_word_embeddings": False},
    "lfm2": _lfm2,
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_5,
    "kimi_linear": _kimi_linear,
    "nemotron_h": _nemotron_h,
    "recurrent_gemma": _recurrent_gemma,
    "jamba": _jamba,
    "falcon_h1": _falcon_h1,
    "deepseek_v32": lambda d: {**_mla(d), "index_head_dim": 16, "index_n_heads": 2,
                               "index_topk": 8},
}

SHAPES = CLASSIC + tuple(_EXTRA)


def model_config(shape: str, d: Dims, dtype: str, eos: int, bos: int) -> dict[str, Any]:
    """config.json contents (before quantization) of a tiny ``shape`` checkpoint."""
    if shape in CLASSIC:
        return classic_config(shape, d, dtype, eos, bos)
    arch = "".join(part.capitalize() for part in shape.split("_")) + "ForCausalLM"
    cfg = {"architectures": [arch], **_common(shape, d), **_EXTRA[shape](d)}
    cfg.update(torch_dtype=dtype, eos_token_id=eos, bos_token_id=bos)
    return cfg
