import sys

from rlcompare.report.build import main

sys.exit(main())
