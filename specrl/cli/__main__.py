"""``python -m specrl.cli``: the same as the ``specrl`` command."""

import sys

from specrl.cli import main

sys.exit(main())
