"""mlxcel-family-kokoro: Kokoro-82M text to speech served by mlxcel's ``speak`` task, the
model from mlx-audio and the G2P from misaki with the bundled espeak-ng."""
