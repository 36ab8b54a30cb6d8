"""The PySpark analysis of timer traces: ``aiowheel report``.

* ``inputs``: finds the trace files and checks them (pyarrow only, before any JVM);
* ``job``: the Spark aggregations; runnable by ``spark-submit`` as a file;
* ``plots``: the PNG plots (matplotlib, Agg);
* ``report``: the command line (``main``), progress, and the atomic output directory.

Nothing here is imported by ``import aiowheel``; pyspark is imported only once the
inputs are known to be good and a Java runtime was found.
"""
