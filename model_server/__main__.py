"""``python -m model_server`` = ``modelpool-server``."""

from model_server.main import main

if __name__ == "__main__":  # not when a spawned process of the worker imports the parent's main module
    main()
