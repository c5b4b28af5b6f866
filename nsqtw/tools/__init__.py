"""Command-line tools: nsqtw-bench."""
