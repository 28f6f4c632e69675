"""The side models' rows of the options table (``mlxcel.options``): the embedding,
reranker, speech-to-text and text-to-speech models beside the chat model, the serving modes that restrict the process to them,
and their pooling, normalization, batching and queue limits. Row format as the table's:
(flags, dest, type, default, env twin, help[, llama kind[, second env twin]])."""

from __future__ import annotations

from typing import Any

from mlxcel.option_types import KEPT, Toggle, choice

SIDE_ROWS: tuple[tuple[Any, ...], ...] = (
    (("--embedding-model",), "embedding_model", str, None, "LLAMA_ARG_EMBEDDING_MODEL",
     "an embedding model served beside the chat model (/v1/embeddings, /embedding); "
     "needs mlxcel-family-embeddings", None, "MLXCEL_EMBEDDING_MODEL"),
    (("--reranker-model",), "reranker_model", str, None, "LLAMA_ARG_RERANKER_MODEL",
     "a reranker served beside the chat model (/v1/rerank, /rerank); a generative "
     "reranker (Qwen3-Reranker) needs this flag", None, "MLXCEL_RERANKER_MODEL"),
    (("--embedding", "--embeddings"), "embeddings", Toggle(), False, "LLAMA_ARG_EMBEDDINGS",
     "serve embeddings only: -m (or --embedding-model) is the embedder, and the "
     "generation routes answer 501", KEPT),
    (("--rerank", "--reranking"), "reranking", Toggle(), False, "LLAMA_ARG_RERANKING",
     "serve reranking only: -m (or --reranker-model) is the reranker, and the generation "
     "routes answer 501", KEPT),
    (("--pooling",), "pooling", choice("pooling", "none", "mean", "cls", "last", "rank"),
     None, "LLAMA_ARG_POOLING", "the embedder's pooling (default: the checkpoint's "
     "sentence-transformers 1_Pooling config); none gives one vector per token", KEPT,
     "MLXCEL_EMBEDDING_POOLING"),
    (("--embd-normalize",), "embd_normalize", int, 2, "MLXCEL_EMBD_NORMALIZE",
     "embedding normalization: -1 none, 0 max-abs to int16, 1 taxicab, 2 euclidean, "
     ">2 p-norm", KEPT),
    (("--embedding-batch-size",), "embedding_batch_size", int, 16,
     "MLXCEL_EMBEDDING_BATCH_SIZE",
     "most inputs one embedding forward takes, across the requests queued together"),
    (("--embedding-max-length",), "embedding_max_length", int, 0,
     "MLXCEL_EMBEDDING_MAX_LENGTH",
     "most tokens one embedding input may have (0: the model's, at most 8192); longer is "
     "a 400"),
    (("--embedding-queue-depth",), "embedding_queue_depth", int, 8,
     "MLXCEL_EMBEDDING_QUEUE_DEPTH",
     "embedding (and rerank) requests queued at once; more get 503"),
    (("--embedding-request-timeout-secs",), "embedding_request_timeout_secs", float, 120.0,
     "MLXCEL_EMBEDDING_REQUEST_TIMEOUT_SECS",
     "seconds an embedding (or rerank) request may wait and run; then 504"),
    (("--rerank-batch-size",), "rerank_batch_size", int, 8, "MLXCEL_RERANK_BATCH_SIZE",
     "most (query, document) pairs one rerank forward takes"),
    (("--stt-model",), "stt_model", str, None, "MLXCEL_STT_MODEL",
     "a speech-to-text model (Whisper) served beside the chat model "
     "(/v1/audio/transcriptions, /v1/audio/translations); needs mlxcel-family-whisper"),
    (("--tts-model",), "tts_model", str, None, "MLXCEL_TTS_MODEL",
     "a text-to-speech model (Kokoro) served beside the chat model (/v1/audio/speech); "
     "needs mlxcel-family-kokoro"),
    (("--image-model",), "image_model", str, None, "MLXCEL_IMAGE_MODEL",
     "an image generation model served beside the chat model (/v1/images/generations, "
     "/v1/images/edits); not built yet: giving it refuses to start"),
    (("--audio-queue-depth",), "audio_queue_depth", int, 8, "MLXCEL_AUDIO_QUEUE_DEPTH",
     "transcription and speech requests queued at once, per model; more get 503"),
    (("--audio-request-timeout-secs",), "audio_request_timeout_secs", float, 120.0,
     "MLXCEL_AUDIO_REQUEST_TIMEOUT_SECS",
     "seconds a transcription or speech request may wait and run; then 504"),
)
