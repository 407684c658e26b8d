import sys

from gpushare_sim.node.main import main

sys.exit(main())
