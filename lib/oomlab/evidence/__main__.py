"""``python -m oomlab.evidence NAME`` / ``all``: regenerate a committed document (see :mod:`.regenerate`)."""

import sys

from oomlab.evidence.regenerate import main

sys.exit(main())
