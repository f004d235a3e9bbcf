"""The local control plane: its binaries built from the Go module proxy (``build``,
``pins``, ``cache``), its certificates (``pki``), its processes (``processes``), the cluster
(``cluster``) and its kubeconfigs."""
