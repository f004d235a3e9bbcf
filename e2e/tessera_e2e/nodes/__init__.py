"""The test bed's real nodes: kubelet + containerd + runc + kube-proxy in namespaces of their
own (``node``), what each is told (``config``), their network and cgroups, and the OCI
images their pods run (``images``)."""
