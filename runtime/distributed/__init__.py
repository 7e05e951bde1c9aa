"""Multi-process runtime for `mode=real` layouts with more than one GPU (tp, ep, dp): launch and
watchdog, process groups, step-plan broadcast, weight sharding and the parallel layers."""
