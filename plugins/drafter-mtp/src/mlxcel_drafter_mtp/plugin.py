"""The entry point: register the drafters that read MTP heads inside the target.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
session (mlx-vlm's MTP module) is a ``"module:attr"`` string, imported on first use.
``--spec-type draft-mtp`` (or ``--draft-kind mtp``) without ``-md`` picks it for a target
whose ``model_type`` it lists (``mlxcel.drafters.select``).
"""

from mlxcel.drafters.api import Drafter
from mlxcel.plugin_kit import adding

# Qwen3.5/3.6 checkpoints, dense and MoE; the *_text types are their text-only configs
QWEN3_5_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")


mlxcel_register_drafters = adding("mlxcel_register_drafters", Drafter(
    name="qwen3_5-mtp", kind="mtp", session="mlxcel_drafter_mtp.qwen3_5:new_session",
    needs_model=False, model_types=QWEN3_5_TYPES))
