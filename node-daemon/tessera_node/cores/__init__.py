"""The core-share control loop: one controller per GPU or MIG instance holding core-budgeted
containers, setting each container's launch-token rate so that it gets its share of the
device (docs/node-daemon.md, "Core controller").

The laws are pure and property-tested: ``fairshare`` (who gets what share), ``ratelaw``
(shares to rates from NVML's per-process utilisation, on a GPU) and ``tokenlaw`` (shares to
rates from the ledgers' token counts, in a MIG instance). ``attribution`` names the
processes behind NVML's host PIDs, ``utilization`` reads NVML's per-process samples through
the daemon's reader, ``controller`` runs one device's period (read, decide, write the budget
file), ``runner`` is the daemon's loop over every device (``CoreControl``), and
``standalone`` runs that same loop without the rest of the daemon (bare metal, benchmarks).
"""
