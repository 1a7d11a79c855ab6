"""``python -m modelpool_gateway`` = the ``modelpool-gateway`` console script."""

from modelpool_gateway.main import main

main()
