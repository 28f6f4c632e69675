"""The entry point: register the drafters that read MTP heads inside the target, and
DFlash drafters.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
sessions (mlx-vlm's MTP and DFlash modules) are ``"module:attr"`` strings, imported on
first use. ``--spec-type draft-mtp`` (or ``--draft-kind mtp``) without ``-md`` picks the
MTP heads for a target whose ``model_type`` it lists; ``-md`` with a DFlash checkpoint
picks the DFlash drafter (``mlxcel.drafters.select``).
"""

from mlxcel.drafters.api import Drafter
from mlxcel.plugin_kit import adding

# Qwen3.5/3.6 checkpoints, dense and MoE; the *_text types are their text-only configs
QWEN3_5_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")
# DFlash draft checkpoints whose model is mlx-vlm's DFlashDraftModel (a model_type with a
# dflash_config beside it reads as <model_type>_dflash)
DFLASH_TYPES = ("qwen3_dflash", "gemma4_dflash")


mlxcel_register_drafters = adding(
    "mlxcel_register_drafters",
    Drafter(name="qwen3_5-mtp", kind="mtp", session="mlxcel_drafter_mtp.qwen3_5:new_session",
            needs_model=False, model_types=QWEN3_5_TYPES),
    Drafter(name="dflash", kind="dflash", session="mlxcel_drafter_mtp.dflash:new_session",
            needs_model=True, model_types=DFLASH_TYPES))
