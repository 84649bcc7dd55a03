"""Developer tools (not installed): generated documentation tables."""
