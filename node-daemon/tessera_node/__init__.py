"""tessera node daemon: enacts GPUPartition layouts and GPUQuota budgets on one GPU node.

Its folders, lowest layer first (each imports only those before it): ``device`` (what the
host and the GPUs say), ``budget`` (a container's budget file and ledger), ``layout`` (MIG
layouts: desired, plan, commands, enact, the per-GPU queue), ``deviceplugin`` (the kubelet
device plugin and the containers it set up), ``cores`` (the core-share control loop) and
``audit`` (GPU processes against budgets), ``node`` (what the own Node says, and the
reconciler); ``settings``, ``metrics``, ``app`` and ``cli`` are the process's.
"""
