import sys

from pooltriton.gateway.app import main

sys.exit(main())
