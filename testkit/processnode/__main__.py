"""`python -m testkit.processnode`: run the process node agent (see testkit/processnode/agent.py)."""

import sys

from testkit.processnode.agent import main

sys.exit(main())
