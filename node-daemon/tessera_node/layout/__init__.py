"""MIG layouts on this node, mig-parted style: what each GPU should look like
(:mod:`.desired`), the steps from what it is to that (:mod:`.plan`), and who carries them
out (:mod:`.enact`).  Verifying is planning again after acting: an empty plan."""
