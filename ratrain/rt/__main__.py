"""`mpiexec -n <ranks> python -m ratrain.rt DIR [options]`: run a compiled program."""
import os
import sys

from ratrain.rt.stop import listen

listen()  # first: a stop signal during the imports below is kept for the first step

from ratrain.rt.threads import thread_environment  # noqa: E402  (after listen)

# one thread pool per rank, its share of the node's cores (NOTE [threads per rank]),
# set before numpy loads
os.environ.update(thread_environment(os.environ, os.cpu_count() or 1))
from ratrain.rt.run import main  # noqa: E402  (after the thread settings)

sys.exit(main())
