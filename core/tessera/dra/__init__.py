"""What tessera tells Kubernetes' Dynamic Resource Allocation about a node's GPUs (pure):
the devices of its ResourceSlices (:mod:`.devices`) and how they are published (:mod:`.slices`).
See docs/dra.md."""
