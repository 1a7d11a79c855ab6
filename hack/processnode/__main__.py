"""`python -m hack.processnode`: run the process node agent (see hack/processnode/agent.py)."""

import sys

from hack.processnode.agent import main

sys.exit(main())
