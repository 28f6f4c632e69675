"""{{dist}}: the {{tool_format}} tool-call format for mlxcel."""
