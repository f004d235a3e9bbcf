"""What the node's hardware and host say, behind small interfaces: what the GPUs look like
now (:mod:`.state`, and each GPU's model), read through NVML (:mod:`.nvml`, the one place
that calls it); MIG changes through ``nvidia-smi`` (:mod:`.smi`) under a host lock per GPU
(:mod:`.hostlock`); host processes in ``/proc`` (:mod:`.procfs`, the one parser, and the pod
a process's cgroup names, :mod:`.cgroups`); what one CUDA context holds on a device
(:mod:`.context_probe`). Nothing here imports the rest of the daemon."""
