"""The engine's caches: batch KV caches (``kvcache``), what each cache kind lets a prompt
cache reuse (``kinds``), the prompt cache with its checkpoints (``prompt_cache``) and its
disk tier."""
