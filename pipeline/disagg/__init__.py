"""Disaggregated prefill/decode deployments on the simulated device: the `disagg.*`
keys (config), the deployment (deployment), its closed loop (closed_loop), a decode
instance's admission (admission) and a request's time to first token (latency)."""
