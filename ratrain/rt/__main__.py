"""`mpiexec -n <ranks> python -m ratrain.rt DIR [options]`: run a compiled program."""
import sys

from ratrain.rt.run import main

sys.exit(main())
