"""mlxcel-family-whisper: Whisper checkpoints served by mlxcel's ``transcribe`` task, the
model and its decoding from mlx-audio."""
