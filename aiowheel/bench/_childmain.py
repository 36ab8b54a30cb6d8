"""``python -m aiowheel.bench._childmain``: a ``-pure`` contender's child process.

Its own module, which the package never imports, so that ``-m`` runs it once (see
``child.py`` for what it does).
"""

import sys

from .child import main

if __name__ == "__main__":
    sys.exit(main())
