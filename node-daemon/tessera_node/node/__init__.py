"""What the daemon's own Node says, and the loop that keeps it so: the GPUs' inventory
(:mod:`.inventory`), the per-partition reports (:mod:`.reports`), findings about the node
(:mod:`.findings`) such as other GPU stacks (:mod:`.coexistence`), all of it computed in one
pure pass (:mod:`.content`) and written as one merge patch (:mod:`.patch`) by the reconciler
(:mod:`.reconciler`: the watches, the NVML poll, the reconcile loop)."""
