import sys

from detectorkit.cli import main

sys.exit(main())
