"""The PySpark analysis of timer traces: ``aiowheel report``.

Dependencies run one way, from the command line down to the shared names:

* ``report``: the command line (``main``), checks, progress, the atomic output directory;
* ``job``: the Spark pipeline (``run_job``), used by ``report`` and the tests alike;
* ``render``: the tables and ``report.md``; ``plots``: the PNG figures (matplotlib, Agg);
* ``bench_results``: the bench's ``bench-results.json`` and the headline's ratios;
* ``inputs``: finds the trace files and checks them (pyarrow only, before any JVM);
* ``schema``: the names all of them share; imports none of them;
* ``submit``: the file ``spark-submit`` runs (the command line, under spark-submit).

Nothing here is imported by ``import aiowheel``; pyspark is imported only once the
inputs are known to be good and a Java runtime was found.
"""
