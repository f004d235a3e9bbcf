"""What ``helm uninstall`` must remove that the chart did not create (its pre-delete hook)."""
