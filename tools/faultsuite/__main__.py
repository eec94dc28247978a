import sys

from tools.faultsuite.run import main

sys.exit(main())
