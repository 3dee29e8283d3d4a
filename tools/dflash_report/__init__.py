"""dflash-report: the topology verdict from a dflash-train metrics.h5 (docs/report.md)."""

import os
import re


def version():
    """The project's version (CMakeLists.txt's project(... VERSION x)), the one dflash-train --version prints."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "CMakeLists.txt")
    try:
        with open(path) as f:
            m = re.search(r"project\(\s*dflash-train\b[^)]*\bVERSION\s+([0-9][0-9.]*)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"
