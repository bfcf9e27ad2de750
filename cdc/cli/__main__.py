"""``python -m cdc.cli``: the ``cdc`` command."""

import sys

from cdc.cli import main

sys.exit(main())
