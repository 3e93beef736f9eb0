import sys

from xsearch.cli.main import main

sys.exit(main())
