"""Dialect-neutral speech: uploads decoded and checked (``upload``), the runner's jobs on
the engine's job lane with their pieces streamed back (``jobs``), transcripts rendered in
OpenAI's formats (``transcripts``) and audio encoded (``encode``). The runners' contract
is ``mlxcel.families.speech``; the dialects only shape the wire."""
