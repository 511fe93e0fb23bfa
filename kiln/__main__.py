"""``python -m kiln`` is the ``kiln`` command."""

import sys

try:
    from .cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C while kiln itself is still being imported
    sys.stderr.write("kiln: interrupted\n")
    code = 130
sys.exit(code)
