"""tessera node daemon: enacts GPUPartition layouts and GPUQuota budgets on one GPU node."""
