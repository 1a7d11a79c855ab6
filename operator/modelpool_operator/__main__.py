"""``python -m modelpool_operator``: the same as the ``modelpool-operator`` console script."""

import sys

from modelpool_operator.main import main

sys.exit(main())
