"""tessera-node as a DRA driver (``--dra``): what its node's ResourceSlices say and when they
are written (:mod:`.decide`, pure), the node's devices as the MIG enactor leaves them
(:mod:`.state`) and the publisher that writes them (:mod:`.publisher`). docs/dra.md."""
