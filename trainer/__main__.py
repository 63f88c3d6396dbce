import sys

from ddpwatch.train import main

sys.exit(main())
