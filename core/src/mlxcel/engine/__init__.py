"""The engine: one thread owns all MLX work. Imports neither litestar nor any dialect."""
