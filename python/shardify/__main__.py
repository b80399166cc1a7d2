"""``python -m shardify``: the command line."""

from ._cli import main

if __name__ == "__main__":
    main()
