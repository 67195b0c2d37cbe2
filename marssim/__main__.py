import sys

from marssim.cli import main

sys.exit(main())
