import sys

from pooltriton.client.cli import main

sys.exit(main())
