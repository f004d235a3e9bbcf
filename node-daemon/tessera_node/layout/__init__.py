"""MIG layouts on this node, mig-parted style: what each GPU should look like
(:mod:`.desired`), the steps from what it is to that (:mod:`.plan`), those steps as
``nvidia-smi`` commands (:mod:`.commands`), who carries them out (:mod:`.enact`) and the
per-GPU queue of plans (:mod:`.queue`). Before destroying anything the enactor asks which
pods hold devices (:mod:`.holders`) and withdraws what goes away from what the node
advertises (:mod:`.advertise`). Verifying is planning again after acting: an empty plan."""
