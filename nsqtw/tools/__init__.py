"""Command-line tools: nsqtw-bench and the ``nsqtw`` console script (cli.py) with its subcommands."""
