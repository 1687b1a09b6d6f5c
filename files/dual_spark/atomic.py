"""Files written whole: the text goes into a private file of an unpredictable name beside the
target (mkstemp: O_EXCL, no link followed, mode 0600), which is then renamed over it. A reader
never sees half a file, and a link planted at a name known in advance is never written through."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path``, then mode ``mode``; the temporary file is .NAME.*.tmp (not NAME's
    suffix: an exporter reading *.prom skips it)."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
            os.fchmod(handle.fileno(), mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
