import sys

from gpushare_sim.run.main import main

sys.exit(main())
