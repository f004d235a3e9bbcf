"""What tessera tells Kubernetes' Dynamic Resource Allocation about a node's GPUs (pure):
the devices of its ResourceSlices (:mod:`.devices`), how they are published (:mod:`.slices`),
and what a claim's requests ask (:mod:`.requests`).
See docs/dra.md."""
