"""Drafters: what proposes the tokens a speculative verify step checks (``api``)."""
