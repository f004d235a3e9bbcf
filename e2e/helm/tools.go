//go:build tools

// Package helm pins the helm command tessera_e2e builds, so `go mod tidy` keeps it.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
