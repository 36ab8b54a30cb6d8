"""The file ``spark-submit`` runs: ``aiowheel report``'s command line under spark-submit.

    spark-submit --master local[2] .../aiowheel/analytics/submit.py TRACES... --out DIR

``spark-submit`` (or ``--master``) decides where the job runs; nothing calls
``.master()`` on its own. The path of this file, for scripts:
``python -c 'import aiowheel.analytics.submit as s; print(s.__file__)'``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit runs this file as a script, with its directory first on sys.path: the
# package's modules must not be importable as top-level ones (`schema`, `job`...).
_HERE = Path(__file__).resolve().parent
if __name__ == "__main__" and sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    del sys.path[0]

from aiowheel.analytics.report import main  # noqa: E402 - after the sys.path fix

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
