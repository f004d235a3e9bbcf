"""The kubelet device plugin of tessera-node: ``tessera.dev/vgpu`` shares and one
``tessera.dev/mig-<profile>`` resource per MIG profile.

Pure decisions (what is advertised, preferred allocations, which pod an allocation belongs
to, what Allocate returns) live in their own modules and are table-tested; ``server`` only
speaks gRPC to the kubelet and ``podresources`` only asks the kubelet which pod holds what.
"""
