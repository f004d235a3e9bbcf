"""The placement service: tessera's kube-scheduler extender (the device-plugin path).

``cache`` keeps every replica's view of the GPU nodes (their units, from the inventory the
node daemons publish) and the budgeted pods (the units recorded on them); ``service`` is the
leader's decisions (filter, bind, preempt) over that view and its own
reservations, calling the pure rules of :mod:`tessera.placement`; ``extender`` is the HTTP
wire (kube-scheduler's extender JSON), served on the webhook port by every replica, and
answered by the Lease holder only (other replicas forward to it).
"""
