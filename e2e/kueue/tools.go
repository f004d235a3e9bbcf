//go:build tools

// Package kueue pins the Kueue controller-manager the test bed runs (see e2e/README.md), so
// `go mod tidy` keeps it.
package kueue

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
