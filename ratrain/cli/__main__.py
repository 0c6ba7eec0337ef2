"""`python -m ratrain.cli ...`: the `ratrain` command."""
import sys

from ratrain.cli import main

sys.exit(main())
