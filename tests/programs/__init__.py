"""Tests of the programs the deploy runs on the nodes, against the archive it ships: built here
once (programs.py) and put first on sys.path, so that ``dual_spark`` imports from it and
``ARCHIVE`` runs it as a node does."""

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import programs

ARCHIVE = Path(tempfile.mkdtemp(prefix="dual-spark-programs-")) / "dual-spark.pyz"
ARCHIVE.write_bytes(programs.built())
atexit.register(shutil.rmtree, ARCHIVE.parent, ignore_errors=True)
sys.path.insert(0, str(ARCHIVE))
