"""``python -m kiln`` is the ``kiln`` command."""

import sys

from .cli import main

sys.exit(main())
