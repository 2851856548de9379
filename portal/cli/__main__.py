"""``python -m portal.cli``: the same as the ``cosched`` script."""

import sys

from portal.cli import main

sys.exit(main())
