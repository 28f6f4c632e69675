"""Gemma 4 for mlxcel: the family, its tool-call format and its reasoning channel."""
