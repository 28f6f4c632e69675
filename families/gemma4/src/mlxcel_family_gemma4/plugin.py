"""The entry point: register the ``gemma4`` family and tool format. Heavy code is named.

mlxcel imports this module at every start-up, so it imports only mlxcel's contracts; the
loader (``load``: mlx-vlm's model where the checkpoint has a vision tower and the
``vision`` extra is installed, else core's text family kit, ``mlxcel.families.text``, as
mlx-lm 0.32 implements ``gemma4`` and ``gemma4_text``), the parser and the assistant
drafter (``mtp``: mlx-vlm's, the ``mtp`` extra) are ``"module:attr"`` strings, imported
on first use.
"""

from mlxcel.drafters.api import Drafter
from mlxcel.families import text
from mlxcel.families.api import Family, LoopPolicy, ReasoningSpec
from mlxcel.plugin_kit import adding
from mlxcel.toolcalls.kit import ToolFormat, register

NAME = "gemma4"
MODEL_TYPES = ("gemma4", "gemma4_text")
TOOL_CALL = ("<|tool_call>", "<tool_call|>")
# Gemma 4 thinks in a channel: <|channel>thought\n ... <channel|> (<|think|> switches it on).
REASONING = ReasoningSpec(open="<|channel>", close="<channel|>", label="thought")
# The spec's Gemma 4 default: a pattern of 1..20 tokens repeated 4 times is a loop.
LOOP = LoopPolicy(min_pattern_size=1, max_pattern_size=20, min_count=4)
# Like the other formats with a marker of their own: above <tool_call> JSON's 10.
SPECIFICITY = 20


def detect(template: str) -> bool:
    """A template that writes ``<|tool_call>`` teaches the model Gemma 4's calls; the
    marker is Gemma 4's own (Hermes writes ``<tool_call>``, without the bar)."""
    return TOOL_CALL[0] in template


mlxcel_register_tool_formats = register(ToolFormat(
    name=NAME, detect=detect, parser="mlxcel_family_gemma4.parser:new_parser",
    specificity=SPECIFICITY, grammar="mlxcel_family_gemma4.grammar:grammar"))

# batch_cache stays None: Gemma 4's rotating and full KV caches have mlx-lm's merge, so the
# engine's mixed path batches them (mlxcel.engine.mixed_batch.cache_path); the vision
# decoder makes mlx-lm's caches too (mlxcel_family_gemma4.vision).
mlxcel_register_families = adding("mlxcel_register_families", Family(
    name=NAME, model_types=MODEL_TYPES, tasks={"generate": "mlxcel_family_gemma4.load:decoder"},
    load="mlxcel_family_gemma4.load:load", check=text.CHECK, default_tool_format=NAME,
    reasoning=REASONING, loop_detection=LOOP))

# -md with a gemma4_assistant checkpoint picks it (mlxcel.drafters.select)
mlxcel_register_drafters = adding("mlxcel_register_drafters", Drafter(
    name="gemma4-assistant", kind="mtp", session="mlxcel_family_gemma4.mtp:new_session",
    needs_model=True, model_types=("gemma4_assistant",)))
