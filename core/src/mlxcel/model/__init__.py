"""A checkpoint's assets: loading, tokenizer, detokenizer, chat templates with their
capability probe, and reasoning selection.

This package sits below both the chat layer and the engine, which receive one loaded
checkpoint from it; neither reaches into the other for the model's assets."""
