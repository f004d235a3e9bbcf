"""Device access behind small interfaces: what the GPUs look like now (:mod:`.state`), read
through NVML (:mod:`.nvml`); MIG changes go through ``nvidia-smi`` (:mod:`.smi`)."""
