"""dflash-report: the topology verdict from a dflash-train metrics.h5 (docs/report.md)."""
