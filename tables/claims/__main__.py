import sys

from tables.claims.report import main

sys.exit(main())
