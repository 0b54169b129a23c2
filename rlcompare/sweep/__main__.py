import sys

from rlcompare.sweep.run import main

sys.exit(main())
