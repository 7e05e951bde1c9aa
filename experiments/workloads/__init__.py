"""Workloads shared by the simulator and the real runtime: each yields sorted `RequestSpec`s.

One file per workload (generators and trace loaders); `base.py` holds the contract.
"""
