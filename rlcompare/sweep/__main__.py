import sys

from rlcompare.sweep.runner import main

sys.exit(main())
