"""acme-mlxcel-plugin: the acme-xml tool-call format (and the acme family that uses it)."""
