"""``python -m anysr COMMAND``."""

import sys

from anysr.cli import main

sys.exit(main())
