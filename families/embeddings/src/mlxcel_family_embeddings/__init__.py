"""mlxcel-family-embeddings: embedders and rerankers served by mlxcel's ``embed`` and
``rerank`` tasks, their models from mlx-vlm."""
