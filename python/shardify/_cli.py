"""The ``shardify`` console script: the same command line as the compiled binary."""

import signal
import sys

from . import _native


def main() -> None:
    """Runs ``shardify`` with this process's arguments and exits with its status."""
    # Ctrl-C stops the command as it stops the binary (a conversion resumes from its
    # finished units), rather than waiting for Python to look at its signal flag.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(_native.run_cli(["shardify", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
