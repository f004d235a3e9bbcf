"""Operating tessera: a real Prometheus, the Grafana dashboard's queries and Argo CD's health
check, as they run against the test bed."""
