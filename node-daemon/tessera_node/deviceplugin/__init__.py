"""The kubelet device plugin of tessera-node: ``tessera.dev/vgpu`` shares and one
``tessera.dev/mig-<profile>`` resource per MIG profile, and a budget file per container.

Pure decisions live in their own modules and are table- or property-tested: what is
advertised (``devices``), preferred allocations and Allocate's checks (``allocation``),
which pod an allocation is for (``matcher``), memory never overcommitted (``fit``), budget
file entries from the pod's annotation (``budgets``), live resizes (``resize``), whom the
kubelet is asked about and how fast (``pacing``), what Allocate returns (``response``). The
resource manager (``manager``) applies them to the node's units and the budget files; the
containers it set up are its registry (``registry``: the audit and the core controllers read
it). The I/O around it: the gRPC servers (``server``, ``plugins``), the kubelet's
PodResources (``podresources``, ``listgate``, ``held``), the pod watch (``node_pods``), the
node's devices (``node_devices``), the Node's capacity (``capacity``), the resize outcomes on
the pods (``resize_answers``), libtessera's install (``library``); ``service`` runs them.
"""
