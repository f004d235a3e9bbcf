"""The audit: every period the daemon compares what NVML says each GPU process holds with
the budgets of the containers tessera set up, and finds containers over their memory budget
and GPU processes that belong to no tessera container (docs/node-daemon.md, "Audit").

``registry`` (what tessera set up on this node), ``cgroups`` and ``logic`` (pure),
``procfs`` (reading and stopping host processes) and ``runner`` (the periodic I/O).
"""
