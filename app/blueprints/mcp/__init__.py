"""The agents' door: the module catalog as an MCP server at ``/mcp`` (docs/mcp.md)."""
