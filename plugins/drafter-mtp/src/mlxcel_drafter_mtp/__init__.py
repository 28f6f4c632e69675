"""mlxcel-drafter-mtp: speculative decoding from the MTP heads inside the target."""
