import sys

from pooltriton.clients.cli import main

sys.exit(main())
