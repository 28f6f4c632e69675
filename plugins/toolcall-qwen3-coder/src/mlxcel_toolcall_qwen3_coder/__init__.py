"""mlxcel-toolcall-qwen3-coder: the Qwen3-Coder XML tool-call format for mlxcel."""
