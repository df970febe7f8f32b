"""``python -m mpviz ...``: see mpviz/cli.py."""
import sys

from mpviz.cli import main

if __name__ == "__main__":
    sys.exit(main())
