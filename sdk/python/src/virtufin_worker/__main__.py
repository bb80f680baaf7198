"""``python -m virtufin_worker``: see :mod:`virtufin_worker.cli`."""

import sys

from .cli import main

sys.exit(main())
