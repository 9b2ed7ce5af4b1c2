import sys

from dse.study.cli import main

sys.exit(main())
