import sys

from rlcompare.bench.against_trl import main

sys.exit(main())
