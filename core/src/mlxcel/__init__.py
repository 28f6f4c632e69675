"""mlxcel: an LLM inference server on Apple's MLX.

``mlxcel.hookimpl`` marks a plugin's hook implementations (``mlxcel.hookspecs`` documents
each hook); importing it costs only pluggy.
"""

from mlxcel.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["hookimpl", "__version__"]
