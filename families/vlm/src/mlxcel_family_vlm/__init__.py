"""mlxcel-family-vlm: vision-language models served by mlxcel's ``generate`` task, their
models and processors from mlx-vlm."""
