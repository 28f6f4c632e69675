"""The plugins core ships, by entry-point name: what a test of plugin loading expects
installed and loaded (``core/pyproject.toml`` declares the same), in one place so the
unit and process-level tests hold the same list."""

BUILTINS: dict[str, str] = {
    "family-text": "mlxcel.builtin.text_family",
    "dialect-openai": "mlxcel.dialects.openai.plugin",
    "dialect-llamacpp": "mlxcel.dialects.llamacpp.plugin",
    "dialect-anthropic": "mlxcel.dialects.anthropic.plugin",
    "dialect-responses": "mlxcel.dialects.responses.plugin",
    "toolcall-builtin": "mlxcel.builtin.toolcalls.plugin",
    "media-builtin": "mlxcel.builtin.media",
}
