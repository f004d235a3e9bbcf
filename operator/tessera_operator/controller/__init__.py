"""The operator process: Lease election, kopf handlers, server-side filtered watches, status
loops, metrics; ``local`` runs it against a local control plane."""
