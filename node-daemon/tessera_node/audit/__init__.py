"""The audit: every period the daemon compares what NVML says each GPU process holds with
the budgets of the containers tessera set up, and finds containers over their memory budget
and GPU processes that belong to no tessera container (docs/node-daemon.md, "Audit").

``logic`` (pure: the decisions) and ``runner`` (the periodic I/O). What tessera set up on
this node is the device plugin's registry (:mod:`tessera_node.deviceplugin.registry`); host
processes are read and stopped through :mod:`tessera_node.device.procfs`.
"""
