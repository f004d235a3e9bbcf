"""Kueue on the test bed: its manifests rendered from the pinned module's own config/
(:mod:`.manifests`) and its controller-manager run as a local process against the test bed's
API server (:mod:`.manager`). The binary is built by
:func:`tessera_e2e.controlplane.build.ensure_kueue`."""
