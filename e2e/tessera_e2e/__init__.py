"""A real local Kubernetes control plane for tessera's integration tests and demo.

kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kubectl are built from the
Go module proxy (no Docker here, so no kind), started on loopback with throw-away
certificates, and always cleaned up, even after the test runner is SIGKILLed.
"""
