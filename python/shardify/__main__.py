"""``python -m shardify``: the command line."""

from ._cli import main

main()
