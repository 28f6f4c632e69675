"""mlxcel: an LLM inference server on Apple's MLX."""

__version__ = "0.1.0"
