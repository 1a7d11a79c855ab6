"""Cluster-level tests: the Helm chart, the Dockerfile, the examples, and the operator installed by the chart
on the local control plane (or on kind, through e2e/kind.sh)."""
