"""The process node: a small kubelet-like agent that runs pods bound to it as local processes.

Dev/test tooling for the local control plane (see docs/cluster.md), not part of the product.
"""
