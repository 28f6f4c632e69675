"""Test helpers: tiny random-weight checkpoints, benchmark servers and a pytest plugin.

Importing this package does not import mlx, mlx_lm, transformers or numpy.
"""

from .bench_checkpoints import bench_checkpoint
from .checkpoint import (
    BUILDER_VERSION,
    build_checkpoint,
    cached_checkpoint,
    default_cache_dir,
    demo_checkpoint,
)
from .servers import Server, server_argv, stream_chat
from .tokenizer import build_tokenizer, chat_template_text

__all__ = [
    "BUILDER_VERSION",
    "Server",
    "bench_checkpoint",
    "build_checkpoint",
    "build_tokenizer",
    "cached_checkpoint",
    "chat_template_text",
    "default_cache_dir",
    "demo_checkpoint",
    "server_argv",
    "stream_chat",
]
