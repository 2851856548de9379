"""``python -m workers.agent``: run a node agent (``workers.agent.cli``)."""

import sys

from workers.agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
