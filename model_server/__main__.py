"""``python -m model_server`` = ``modelpool-server``."""

from model_server.main import main

main()
