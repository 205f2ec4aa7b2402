import sys

from oomlab.cli import main

sys.exit(main())
